;;; keel.el --- eglot setup and commands for keel missions  -*- lexical-binding: t; -*-

;; Version: 0.1.0
;; Package-Requires: ((emacs "28.1") (eglot "1.9"))
;; Keywords: tools, languages

;;; Commentary:

;; keel's language server (`keel serve') for mission files, through eglot:
;;
;;   (require 'keel)
;;   (keel-setup)
;;
;; `keel-setup' tells eglot to run `keel serve' for TOML buffers (`conf-toml-mode' on Emacs 28,
;; `toml-ts-mode' on 29+), starts it in mission files (a `[mission]' table, or a workspace with a
;; .keel folder) and shows the newest mission in the mode line: its state in words, units done of
;; all and the running unit (" keel[ship running 2/5 40% · u3 Rewrite imports]").  A mission's
;; question is asked at a prompt (its choices with completion) as soon as `keel/missionChanged'
;; brings it, or when Emacs connects while it waits; a finished mission is announced.  Commands:
;; `keel-missions', `keel-start', `keel-pause', `keel-resume', `keel-answer', each reading a mission
;; id with completion from `keel/missions'.  Everything here is the protocol in keel's docs/lsp.md
;; (and a wait for `keel serve' to exit on eglot's shutdown); nothing else.

;;; Code:

(require 'cl-lib)
(require 'subr-x)
(require 'eglot)
(require 'jsonrpc)

(defgroup keel nil
  "keel missions through eglot."
  :group 'tools
  :prefix "keel-")

(defcustom keel-server-command '("keel" "serve")
  "How to start keel's language server."
  :type '(repeat string))

(defcustom keel-major-modes '(conf-toml-mode toml-ts-mode)
  "Major modes of mission files: `.toml' opens in `conf-toml-mode' on Emacs 28."
  :type '(repeat symbol))

(defcustom keel-prompt-questions (not noninteractive)
  "Non-nil: offer a mission's question as a prompt, answered with `keel.answer'.
Off in batch Emacs, whose minibuffer reads standard input: the question is
then a message naming `keel-answer'."
  :type 'boolean)

(defcustom keel-exit-timeout 3
  "Seconds eglot's shutdown waits for `keel serve' to exit by itself.
After them the server is killed."
  :type 'number)

(defclass keel-eglot-server (eglot-lsp-server) ()
  :documentation "An eglot connection to `keel serve'.")

(defvar keel-missions (make-hash-table :test #'equal)
  "Mission id -> MissionSummary plist.
Filled from `keel/missions' and `keel/missionChanged'.")

(defconst keel--active-states '("running" "pausing" "waiting_input" "paused" "offline")
  "States of a mission that is not finished.")

(defconst keel--finished-states '("completed" "failed" "cancelled")
  "States a mission ends in.")

(defvar keel--asked (make-hash-table :test #'equal)
  "Questions already offered, as \"ID/UNIT/SEQ\" -> t: each is asked once.")

(defvar keel--finished nil
  "The id of the mission this Emacs last saw finish, for the mode line.")

;;; The connection

(defun keel-server ()
  "The keel server of this buffer, or else any live one; an error when none runs."
  (or (let ((server (eglot-current-server)))
        (and (cl-typep server 'keel-eglot-server) server))
      (cl-loop for servers being the hash-values of eglot--servers-by-project
               thereis (cl-find-if (lambda (s) (and (cl-typep s 'keel-eglot-server)
                                                    (jsonrpc-running-p s)))
                                   servers))
      (user-error "keel: no keel server is running (open a mission file, or M-x eglot in one)")))

(defun keel--remember (summary)
  "Store SUMMARY (a MissionSummary plist) unless its mission has a newer one.
A command's answer can arrive after the notification of a later change (a
pause acknowledged as pausing, after the one that says it is paused): the
summary with the later `updatedAt' stays.  Return the one that stays."
  (let* ((id (plist-get summary :id))
         (stored (and id (gethash id keel-missions))))
    (if (and stored (> (or (plist-get stored :updatedAt) 0) (or (plist-get summary :updatedAt) 0)))
        stored
      (when id
        (puthash id summary keel-missions)
        (force-mode-line-update t))
      summary)))

(defun keel-request (method &optional params)
  "Send METHOD (\"keel/missions\"…) with PARAMS to keel; return the result.
A server error is raised as a `user-error' with the server's message."
  (condition-case err
      (jsonrpc-request (keel-server) (intern (concat ":" method)) params)
    (jsonrpc-error
     (user-error "keel: %s" (or (alist-get 'jsonrpc-error-message (cdr err)) (cadr err))))))

(defun keel-command (command &rest arguments)
  "Run the keel COMMAND (\"keel.pause\"…) with ARGUMENTS and return its result."
  (keel-request "workspace/executeCommand" (list :command command :arguments (vconcat arguments))))

(defun keel-list-missions ()
  "Every mission, oldest first; refreshes `keel-missions'."
  (let ((missions (append (keel-request "keel/missions" (make-hash-table)) nil)))
    (mapc #'keel--remember missions)
    missions))

(cl-defmethod eglot-client-capabilities ((_server keel-eglot-server))
  "Announce `window.showMessage' and `window.workDoneProgress'.
This file asks keel's questions itself and shows progress in the mode line:
keel serve sends its question request, which keel.el dismisses, and its
progress as `$/progress', which keel.el leaves to the mode line; to a client
that announces no progress it would send each step as a message."
  (let* ((caps (cl-call-next-method))
         (window (copy-sequence (plist-get caps :window))))
    (setq window (plist-put window :showMessage
                            (list :messageActionItem (list :additionalPropertiesSupport :json-false))))
    (plist-put caps :window (plist-put window :workDoneProgress t))))

(cl-defmethod eglot-handle-request
  ((_server keel-eglot-server) (_method (eql window/workDoneProgress/create)) &rest _)
  "Accept keel's progress token (the mode line shows the progress)."
  nil)

(cl-defmethod eglot-handle-notification
  ((_server keel-eglot-server) (_method (eql $/progress)) &rest _)
  "Leave keel's progress to the mode line, which `keel/missionChanged' keeps."
  nil)

(cl-defmethod eglot-handle-notification
  ((_server keel-eglot-server) (_method (eql keel/missionChanged)) &rest summary)
  "Keep the mission map and the mode line up to date.
Ask a new question; say when a mission ends."
  (let ((before (plist-get (gethash (plist-get summary :id) keel-missions) :state)))
    (keel--remember summary)
    (when (and before (not (member before keel--finished-states))
               (member (plist-get summary :state) keel--finished-states))
      (setq keel--finished (plist-get summary :id))
      (message "keel: %s" (keel-describe summary)))
    (keel--offer summary)))

(cl-defmethod eglot-handle-request
  ((_server keel-eglot-server) (_method (eql window/showMessageRequest)) &rest _)
  "Dismiss keel's question request: `keel--offer' asks from `keel/missionChanged'.
Announcing `window.showMessage' and answering null keeps keel serve from
showing the question as a plain message besides keel.el's prompt."
  ;; nil is JSON null here: jsonrpc encodes with :null-object nil (eglot 1.9's own :null fails to encode)
  nil)

(cl-defmethod jsonrpc-shutdown :before ((server keel-eglot-server) &optional _cleanup)
  "Let `keel serve' exit by itself after eglot's `exit' notification.
jsonrpc 1.0.14 (Emacs 28) kills the process as soon as `exit' is sent, so
eglot would report \"Server exited with status 9\"; the kill now only
comes after `keel-exit-timeout' seconds."
  (when (eglot--shutdown-requested server)
    (let ((deadline (+ (float-time) keel-exit-timeout)))
      (while (and (jsonrpc-running-p server) (< (float-time) deadline))
        (accept-process-output nil 0.05)))))

;;; Questions

(defun keel--question-key (summary)
  "\"ID/UNIT/SEQ\" of SUMMARY's question, or nil when it asks nothing."
  (let ((question (plist-get summary :question)))
    (and question (equal (plist-get summary :state) "waiting_input")
         (format "%s/%s/%s" (plist-get summary :id) (plist-get question :unit)
                 (plist-get question :seq)))))

(defun keel--prompt (summary)
  "\"keel · NAME (ID) asks: TEXT \" for SUMMARY's question."
  (format "keel · %s (%s) asks: %s " (plist-get summary :name) (plist-get summary :id)
          (plist-get (plist-get summary :question) :text)))

(defun keel--offer (summary)
  "Ask SUMMARY's question once: at a prompt soon, or as a message without prompts.
Never from the process filter itself, which a prompt would block."
  (let ((key (keel--question-key summary)))
    (when (and key (not (gethash key keel--asked)))
      (puthash key t keel--asked)
      (if keel-prompt-questions
          (run-at-time 0 nil #'keel--ask (plist-get summary :id) key)
        (message "%s— M-x keel-answer" (keel--prompt summary))))))

(defun keel--ask (id key)
  "Ask mission ID's question KEY, unless it was answered meanwhile.
While another minibuffer is in use, ask a second later."
  (let ((summary (gethash id keel-missions)))
    (when (equal (keel--question-key summary) key)
      (if (active-minibuffer-window)
          (run-at-time 1 nil #'keel--ask id key)
        (let* ((choices (append (plist-get (plist-get summary :question) :choices) nil))
               (answer (condition-case nil
                           (if choices
                               (completing-read (keel--prompt summary) choices nil t)
                             (read-string (keel--prompt summary)))
                         (quit ""))))
          (if (string-empty-p answer)
              (message "keel: %s waits for an answer — M-x keel-answer" (plist-get summary :name))
            (condition-case err
                (keel-answer id answer)
              (user-error (message "%s" (error-message-string err))))))))))

(defun keel--catch-up (server)
  "Ask the questions missions already wait on when SERVER connects.
Asynchronous: a request waited for here could be cut short by another."
  (when (cl-typep server 'keel-eglot-server)
    (jsonrpc-async-request server :keel/missions (make-hash-table)
                           :success-fn (lambda (missions)
                                         (mapc (lambda (s) (keel--offer (keel--remember s)))
                                               missions)))))

;;; Mission ids with completion

(defun keel-describe (summary)
  "One line saying what SUMMARY's mission is doing."
  (let ((question (plist-get summary :question))
        (error-text (plist-get summary :error)))
    (concat (format "%s (%s) %s" (plist-get summary :name) (plist-get summary :id)
                    (plist-get summary :state))
            (when (and (equal (plist-get summary :state) "paused") (plist-get summary :pauseReason))
              (format " (%s)" (plist-get summary :pauseReason)))
            (when question
              (format " — asks: %s" (plist-get question :text)))
            (when (and error-text (not (string-empty-p error-text)))
              (format " — %s" error-text)))))

(defun keel-read-mission (prompt &optional states)
  "Read a mission id with PROMPT, offering those in STATES (or all)."
  (let* ((missions (keel-list-missions))
         (wanted (cl-remove-if-not (lambda (s) (member (plist-get s :state) states)) missions))
         (offered (or wanted missions))
         (ids (mapcar (lambda (s) (plist-get s :id)) offered))
         (completion-extra-properties
          (list :annotation-function
                (lambda (id) (concat "  " (keel-describe (gethash id keel-missions)))))))
    (unless ids
      (user-error "keel: no missions in this store"))
    (completing-read prompt ids nil nil nil nil (car (last ids)))))

(defun keel--report (summary)
  "Say what SUMMARY (a command's answer) is and return it.
Older servers answer the state the mission was in, newer ones the
acknowledged transition (`pausing'); either is shown as it is, and
`keel/missionChanged' brings the rest."
  (message "keel: %s" (keel-describe (keel--remember summary)))
  summary)

;;; Commands

(defun keel-missions ()
  "Show every mission of the store."
  (interactive)
  (let ((missions (keel-list-missions)))
    (message "%s" (if missions
                      (mapconcat #'keel-describe missions "\n")
                    "keel: no missions in this store"))
    missions))

(defun keel-start (file)
  "Start the mission in FILE (this buffer's, without a prefix argument)."
  (interactive (list (if (and buffer-file-name (not current-prefix-arg) (keel-mission-buffer-p))
                         buffer-file-name
                       (read-file-name "Start mission file: " nil buffer-file-name t))))
  (keel--report (keel-command "keel.startMission" (expand-file-name file))))

(defun keel-pause (id)
  "Pause the mission ID."
  (interactive (list (keel-read-mission "Pause mission: " '("running" "waiting_input" "offline"))))
  (keel--report (keel-command "keel.pause" id)))

(defun keel-resume (id)
  "Resume the mission ID."
  (interactive (list (keel-read-mission "Resume mission: " '("paused" "offline" "pausing"))))
  (keel--report (keel-command "keel.resume" id)))

(defun keel-answer (id text)
  "Answer mission ID's question with TEXT (one of its choices, if any)."
  (interactive
   (let* ((id (keel-read-mission "Answer mission: " '("waiting_input")))
          (question (plist-get (gethash id keel-missions) :question))
          (choices (append (plist-get question :choices) nil))
          (prompt (format "%s " (or (plist-get question :text) "Answer:"))))
     (list id (if choices (completing-read prompt choices nil t) (read-string prompt)))))
  (keel--report (keel-command "keel.answer" id text)))

;;; Mode line

(defun keel-state-text (summary)
  "SUMMARY's state in words, with its units.
\"running 2/5 40% · u3 Rewrite imports\", \"paused (operator) 2/5 40%\"."
  (let* ((state (plist-get summary :state))
         (units (plist-get summary :units))
         (done (format "%d/%d %d%%" (or (plist-get units :done) 0) (or (plist-get units :total) 0)
                       (or (plist-get summary :percentage) 0)))
         (unit (string-trim (format "%s %s" (or (plist-get summary :currentUnit) "")
                                    (or (plist-get summary :currentUnitTitle) "")))))
    (pcase state
      ((or "running" "pausing")
       (concat state " " done
               (if (string-empty-p unit) "" (concat " · " (truncate-string-to-width unit 30 nil nil "…")))))
      ("waiting_input" (concat "waiting for an answer " done))
      ("created" "starting")
      ((or "paused" "offline")
       (let ((reason (plist-get summary :pauseReason)))
         (concat state (if (and reason (not (equal reason state))) (format " (%s)" reason) "") " " done)))
      (_ (concat state " " done)))))

(defun keel-mode-line-string ()
  "The newest unfinished mission as \" keel[NAME STATE]\", or \"\".
Without one, the mission last seen finishing.  The text is a mode-line
construct: a `%' in it is written `%%'."
  (let (best)
    (maphash (lambda (_ s)
               (when (and (member (plist-get s :state) keel--active-states)
                          (or (null best) (> (or (plist-get s :updatedAt) 0)
                                             (or (plist-get best :updatedAt) 0))))
                 (setq best s)))
             keel-missions)
    (setq best (or best (and keel--finished (gethash keel--finished keel-missions))))
    (if (null best)
        ""
      (string-replace "%" "%%" (format " keel[%s %s]" (plist-get best :name) (keel-state-text best))))))

(defconst keel--mode-line-entry '(:eval (keel-mode-line-string)))

(define-minor-mode keel-mode-line-mode
  "Show the newest unfinished keel mission in the mode line."
  :global t
  (setq global-mode-string (delete keel--mode-line-entry (or global-mode-string '(""))))
  (when keel-mode-line-mode
    (setq global-mode-string (append global-mode-string (list keel--mode-line-entry)))))

;;; Setup

(defun keel-mission-buffer-p ()
  "Non-nil in a mission file: a `[mission]' table, or a workspace with .keel."
  (or (save-excursion
        (goto-char (point-min))
        (re-search-forward "^[ \t]*\\[mission\\]" nil t))
      (and buffer-file-name (locate-dominating-file buffer-file-name ".keel"))))

(defun keel-maybe-start ()
  "Start eglot (with `keel serve') in a mission file."
  (when (keel-mission-buffer-p)
    (eglot-ensure)))

(defun keel-setup ()
  "Run `keel serve' through eglot in mission files; show missions in the mode line."
  (interactive)
  (add-to-list 'eglot-server-programs
               (cons keel-major-modes (cons 'keel-eglot-server keel-server-command)))
  (dolist (mode keel-major-modes)
    (add-hook (intern (format "%s-hook" mode)) #'keel-maybe-start))
  (add-hook 'eglot-connect-hook #'keel--catch-up)
  (keel-mode-line-mode 1))

(provide 'keel)
;;; keel.el ends here
