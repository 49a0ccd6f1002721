;;; driver.el --- drives editors/emacs/keel.el as a user would, after the README's snippet  -*- lexical-binding: t; -*-

;; KEEL_EDITOR_SCENARIO "follow" (the default): open a mission file (eglot starts `keel serve'), M-x
;; keel-start, keel-pause and keel-resume (the mission id picked from the completion they offer), answer
;; the first question at the prompt keel.el offers and the second with keel-answer (id and choice by
;; completion), keel-missions, then shut eglot down.  "waiting": open Emacs on a store whose missions
;; already wait on questions and answer each at the prompt keel.el offers.
;; Reads KEEL_EDITOR_MISSION and KEEL_EDITOR_OUT; writes what it saw as JSON to KEEL_EDITOR_OUT and exits 0
;; when every step passed.

(load (expand-file-name "driverkit.el" (file-name-directory load-file-name)) nil t)

(defvar driver-offered nil "What each completing read offered: (PROMPT CANDIDATES ANNOTATIONS).")

;; The minibuffer, as a completion UI (vertico, ivy…) would replace it: record what is offered; answer
;; keel.el's prompt for the first question with "yes" and dismiss it for the second (""), answer
;; keel-answer's question prompt with "yes", anything else with its default.
(setq completing-read-function
      (lambda (prompt collection &optional _pred _req _init _hist default _inherit)
        (let* ((candidates (all-completions "" collection))
               (annotate (plist-get completion-extra-properties :annotation-function)))
          (push (list prompt candidates (and annotate (mapcar annotate candidates))) driver-offered)
          (cond ((string-prefix-p "keel · " prompt) (if (string-match-p "Ship it" prompt) "yes" ""))
                ((string-suffix-p "? " prompt) "yes")
                ((consp default) (car default))
                (t default)))))

;; keel.el prompts for questions in an interactive Emacs; this batch one answers like a person would.
(setq keel-prompt-questions t)

(defun driver-state (id)
  (plist-get (gethash id keel-missions) :state))

(defun driver-wait-state (id state &optional question)
  (driver-wait (format "%s to be %s %s (it is %s)" id state (or question "") (driver-state id))
               (lambda () (and (equal (driver-state id) state)
                               (or (null question)
                                   (equal question (plist-get (plist-get (gethash id keel-missions) :question)
                                                              :text))))))
  (driver-note (intern (concat "modeline-" state)) (driver-mode-line)))

(defun driver-mode-line ()
  "`global-mode-string' as the mode line shows it (`format-mode-line' renders nothing in batch).
What an :eval form gives is itself a mode-line construct: `%%' shows `%', and a lone `%' is a
%-construct that would show something else, so it is shown as \"<unescaped %>\"."
  (mapconcat (lambda (e) (pcase e
                           ((pred stringp) e)
                           (`(:eval ,form) (driver-construct (format "%s" (eval form t))))
                           (_ "")))
             global-mode-string ""))

(defun driver-construct (text)
  (if (string-match-p "%" (replace-regexp-in-string "%%" "" text))
      (concat text "<unescaped %>")
    (string-replace "%%" "%" text)))

(defun driver-connect ()
  (find-file (getenv "KEEL_EDITOR_MISSION"))
  (driver-note 'major-mode (symbol-name major-mode))
  ;; eglot-ensure connects after the command that opened the file, as the command loop would run it
  (run-hooks 'post-command-hook)
  (driver-wait "eglot to connect" (lambda () (ignore-errors (keel-server)))))

(defun driver-prompts (offered)
  (vconcat (mapcar (lambda (o) (vector (car o) (vconcat (cadr o)))) (reverse offered))))

(defun driver-follow ()
  (driver-connect)
  (let* ((started (call-interactively #'keel-start))
         (id (plist-get started :id))
         prompted)
    (driver-note 'mission id)
    (driver-wait-state id "running")
    (driver-wait "keel/missionChanged to name the running unit"
                 (lambda () (plist-get (gethash id keel-missions) :currentUnit)))
    (driver-note 'modeline-unit (driver-mode-line))
    (driver-note 'pause-state (plist-get (call-interactively #'keel-pause) :state))
    (driver-note 'pause-offered (vconcat (cadr (car driver-offered))))
    (driver-note 'pause-annotations (vconcat (nth 2 (car driver-offered))))
    (driver-wait-state id "paused")
    (driver-note 'resume-state (plist-get (call-interactively #'keel-resume) :state))
    (setq driver-offered nil)
    (driver-wait-state id "waiting_input" "Really?")
    (driver-wait "the second question's prompt"
                 (lambda () (assoc (format "keel · ship (%s) asks: Really? " id) driver-offered)))
    (setq prompted driver-offered driver-offered nil)
    (driver-note 'answer-state (plist-get (call-interactively #'keel-answer) :state))
    (driver-note 'answer-offered (driver-prompts driver-offered))
    (driver-wait-state id "completed")
    (driver-note 'prompted (driver-prompts prompted))
    (driver-note 'missions (vconcat (mapcar #'keel-describe (keel-missions))))
    (driver-note 'error (condition-case err (progn (keel-pause "m-no-such-mission") "no error")
                          (error (error-message-string err))))
    (let* ((server (keel-server))
           (proc (jsonrpc--process server)))
      (eglot-shutdown server)
      (driver-note 'server-exit (format "%s %s" (process-status proc) (process-exit-status proc))))))

(defun driver-waiting ()
  (driver-connect)
  (let ((ids (mapcar (lambda (s) (plist-get s :id)) (keel-list-missions))))
    (driver-note 'missions (vconcat ids))
    (dolist (id ids)
      (driver-wait-state id "completed"))
    (driver-note 'prompted (driver-prompts driver-offered))))

(condition-case err
    (progn (if (equal (getenv "KEEL_EDITOR_SCENARIO") "waiting") (driver-waiting) (driver-follow))
           (driver-finish t))
  (error (driver-note 'error (error-message-string err))
         (driver-finish nil)))

;;; driver.el ends here
