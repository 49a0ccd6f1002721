;;; driver.el --- drives editors/emacs/keel.el as a user would, after the README's snippet  -*- lexical-binding: t; -*-

;; Open a mission file (eglot starts `keel serve'), M-x keel-start, keel-pause and keel-resume (the mission
;; id picked from the completion they offer), keel-answer (id and choice by completion), keel-missions.
;; Reads KEEL_EDITOR_MISSION and KEEL_EDITOR_OUT; writes what it saw as JSON to KEEL_EDITOR_OUT and exits 0
;; when every step passed.

(require 'json)

(defvar driver-seen nil "An alist of what was seen.")
(defvar driver-offered nil "What each completing read offered: (PROMPT CANDIDATES ANNOTATIONS).")
(defvar driver-pick nil "What the next completing read answers; nil: the default.")

(defun driver-note (key value)
  (setq driver-seen (cons (cons key value) (assq-delete-all key driver-seen))))

(defun driver-finish (ok)
  (driver-note 'ok (if ok t :json-false))
  (with-temp-file (getenv "KEEL_EDITOR_OUT")
    (insert (json-encode driver-seen)))
  (kill-emacs (if ok 0 1)))

;; The minibuffer, as a completion UI (vertico, ivy…) would replace it: record what is offered.
(setq completing-read-function
      (lambda (prompt collection &optional _pred _req _init _hist default _inherit)
        (let* ((candidates (all-completions "" collection))
               (annotate (plist-get completion-extra-properties :annotation-function)))
          (push (list prompt candidates (and annotate (mapcar annotate candidates))) driver-offered)
          (or driver-pick (if (consp default) (car default) default)))))

(defun driver-wait (what pred)
  (let ((deadline (+ (float-time) 40)))
    (while (and (not (funcall pred)) (< (float-time) deadline))
      (accept-process-output nil 0.05))
    (unless (funcall pred)
      (error "Timed out waiting for %s" what))))

(defun driver-state (id)
  (plist-get (gethash id keel-missions) :state))

(defun driver-wait-state (id state)
  (driver-wait (format "%s to be %s (it is %s)" id state (driver-state id))
               (lambda () (equal (driver-state id) state)))
  (driver-note (intern (concat "modeline-" state)) (driver-mode-line)))

(defun driver-mode-line ()
  "`global-mode-string' as the mode line shows it (`format-mode-line' renders nothing in batch)."
  (mapconcat (lambda (e) (pcase e
                           ((pred stringp) e)
                           (`(:eval ,form) (format "%s" (eval form t)))
                           (_ "")))
             global-mode-string ""))

(defun driver-run ()
  (find-file (getenv "KEEL_EDITOR_MISSION"))
  (driver-note 'major-mode (symbol-name major-mode))
  ;; eglot-ensure connects after the command that opened the file, as the command loop would run it
  (run-hooks 'post-command-hook)
  (driver-wait "eglot to connect" (lambda () (ignore-errors (keel-server))))
  (let* ((started (call-interactively #'keel-start))
         (id (plist-get started :id)))
    (driver-note 'mission id)
    (driver-wait-state id "running")
    (driver-note 'pause-state (plist-get (call-interactively #'keel-pause) :state))
    (driver-note 'pause-offered (vconcat (cadr (car driver-offered))))
    (driver-note 'pause-annotations (vconcat (nth 2 (car driver-offered))))
    (driver-wait-state id "paused")
    (driver-note 'resume-state (plist-get (call-interactively #'keel-resume) :state))
    (driver-wait-state id "waiting_input")
    (setq driver-offered nil)
    (let ((driver-pick nil))
      (setq completing-read-function
            (let ((inner completing-read-function))
              (lambda (prompt collection &rest rest)
                (let ((driver-pick (and (string-prefix-p "Ship it?" prompt) "yes")))
                  (apply inner prompt collection rest)))))
      (driver-note 'answer-state (plist-get (call-interactively #'keel-answer) :state)))
    (driver-note 'answer-offered
                 (vconcat (mapcar (lambda (o) (vector (car o) (vconcat (cadr o)))) (reverse driver-offered))))
    (driver-wait-state id "completed")
    (driver-note 'missions (vconcat (mapcar #'keel-describe (keel-missions))))
    (driver-note 'error (condition-case err (progn (keel-pause "m-no-such-mission") "no error")
                          (error (error-message-string err))))))

(condition-case err
    (progn (driver-run) (driver-finish t))
  (error (driver-note 'error (error-message-string err))
         (driver-finish nil)))

;;; driver.el ends here
