;;; stock_driver.el --- stock eglot (no keel.el) as a client of keel serve  -*- lexical-binding: t; -*-

;; Emacs 28's eglot 1.9 with nothing but `keel serve' in `eglot-server-programs': open the mission file,
;; start the mission through workspace/executeCommand, and answer the questions eglot prompts for.
;; Records every prompt; the echo area's messages go to stderr in batch Emacs.  Writes what it saw as
;; JSON to KEEL_EDITOR_OUT and exits 0 when the mission completed.

(require 'eglot)
(load (expand-file-name "driverkit.el" (file-name-directory load-file-name)) nil t)

(add-to-list 'eglot-server-programs '(conf-toml-mode "keel" "serve"))

(defvar driver-prompts nil "Every prompt of a completing read, newest first: (PROMPT CANDIDATES).")

(add-hook 'driver-before-finish
          (lambda ()
            (driver-note 'prompts (vconcat (mapcar (lambda (p) (vector (car p) (vconcat (cadr p))))
                                                   (reverse driver-prompts))))))

;; eglot asks a server's `window/showMessageRequest' with `completing-read': a person picks "yes".
(setq completing-read-function
      (lambda (prompt collection &rest _)
        (push (list prompt (all-completions "" collection)) driver-prompts)
        "yes"))

(defun driver-state (server id)
  (cl-loop for m across (jsonrpc-request server :keel/missions (make-hash-table))
           when (equal (plist-get m :id) id) return (plist-get m :state)))

(condition-case err
    (let (server id)
      (find-file (getenv "KEEL_EDITOR_MISSION"))
      (eglot-ensure)
      (run-hooks 'post-command-hook)
      (driver-wait "eglot to connect" (lambda () (setq server (eglot-current-server))))
      (setq id (plist-get (eglot-execute-command server 'keel.startMission
                                                 (vector (getenv "KEEL_EDITOR_MISSION")))
                          :id))
      (driver-note 'mission id)
      (driver-wait "the mission to complete" (lambda () (equal (driver-state server id) "completed")) 120)
      (accept-process-output nil 0.5)  ; the last progress message
      (eglot-shutdown server)
      (driver-finish t))
  (error (driver-note 'error (error-message-string err))
         (driver-finish nil)))

;;; stock_driver.el ends here
