;;; driverkit.el --- what the Emacs drivers share: notes, the JSON they leave, waiting  -*- lexical-binding: t; -*-

;; Loaded by driver.el (keel.el) and stock_driver.el (eglot alone).  A driver notes what it saw with
;; `driver-note', waits with `driver-wait' and ends with `driver-finish', which writes the notes as JSON
;; to KEEL_EDITOR_OUT and exits 0 when every step passed.

(require 'json)

(defvar driver-seen nil "An alist of what was seen.")

(defvar driver-before-finish nil "Functions run by `driver-finish' before it writes the notes.")

(defun driver-note (key value)
  (setq driver-seen (cons (cons key value) (assq-delete-all key driver-seen))))

(defun driver-finish (ok)
  (run-hooks 'driver-before-finish)
  (driver-note 'ok (if ok t :json-false))
  (with-temp-file (getenv "KEEL_EDITOR_OUT")
    (insert (json-encode driver-seen)))
  (kill-emacs (if ok 0 1)))

(defun driver-wait (what pred &optional seconds)
  (let ((deadline (+ (float-time) (or seconds 60))))
    (while (and (not (funcall pred)) (< (float-time) deadline))
      (accept-process-output nil 0.05))
    (unless (funcall pred)
      (error "Timed out waiting for %s" what))))

;;; driverkit.el ends here
