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
;; .keel folder) and shows the newest unfinished mission in the mode line.  Commands: `keel-missions',
;; `keel-start', `keel-pause', `keel-resume', `keel-answer', each reading a mission id with completion
;; from `keel/missions'.  Everything here is the protocol in keel's docs/lsp.md; nothing else.

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
Off in batch Emacs, whose minibuffer reads standard input."
  :type 'boolean)

(defclass keel-eglot-server (eglot-lsp-server) ()
  :documentation "An eglot connection to `keel serve'.")

(defvar keel-missions (make-hash-table :test #'equal)
  "Mission id -> MissionSummary plist.
Filled from `keel/missions' and `keel/missionChanged'.")

(defconst keel--active-states '("running" "pausing" "waiting_input" "paused" "offline")
  "States of a mission that is not finished.")

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
  "Store SUMMARY (a MissionSummary plist) and return it."
  (when-let ((id (plist-get summary :id)))
    (puthash id summary keel-missions)
    (force-mode-line-update t))
  summary)

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
  "Announce `window.showMessage': this file answers keel's questions.
keel serve sends a question as `window/showMessageRequest' only to a client
that says it can answer one; eglot answers them but does not say so."
  (let* ((caps (cl-call-next-method))
         (window (plist-get caps :window)))
    (plist-put caps :window
               (plist-put (copy-sequence window) :showMessage
                          (list :messageActionItem
                                (list :additionalPropertiesSupport :json-false))))))

(cl-defmethod eglot-handle-notification
  ((_server keel-eglot-server) (_method (eql keel/missionChanged)) &rest summary)
  "Keep the mission map and the mode line up to date."
  (keel--remember summary))

(cl-defmethod eglot-handle-request
  ((_server keel-eglot-server) (_method (eql window/showMessageRequest)) &key message actions
   &allow-other-keys)
  "Dismiss a question at once, and answer it through `keel.answer' once picked.
A prompt in a process filter would block Emacs and the server meanwhile."
  (let ((choices (mapcar (lambda (a) (plist-get a :title)) (append actions nil))))
    (if keel-prompt-questions
        (run-at-time 0 nil #'keel--ask message choices)
      (message "%s — M-x keel-answer" message)))
  ;; nil is JSON null here: jsonrpc encodes with :null-object nil (eglot 1.9's own :null fails to encode)
  nil)

(defun keel--ask (message choices)
  "Offer CHOICES for the question in MESSAGE (\"keel · NAME asks: TEXT\")."
  (let* ((text (and (string-match " asks: \\(.*\\)\\'" message) (match-string 1 message)))
         (waiting (cl-remove-if-not
                   (lambda (s) (and (equal (plist-get s :state) "waiting_input")
                                    (equal (plist-get (plist-get s :question) :text) text)))
                   (keel-list-missions))))
    (if (/= (length waiting) 1)
        (message "%s — M-x keel-answer" message)
      (let ((choice (completing-read (concat message " ") choices nil t)))
        (unless (string-empty-p choice)
          (keel-answer (plist-get (car waiting) :id) choice))))))

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

(defun keel-mode-line-string ()
  "The newest unfinished mission as \" keel[NAME STATE PCT%]\", or \"\"."
  (let (best)
    (maphash (lambda (_ s)
               (when (and (member (plist-get s :state) keel--active-states)
                          (or (null best) (> (or (plist-get s :updatedAt) 0)
                                             (or (plist-get best :updatedAt) 0))))
                 (setq best s)))
             keel-missions)
    (if (null best)
        ""
      (format " keel[%s %s %d%%%s]" (plist-get best :name) (plist-get best :state)
              (or (plist-get best :percentage) 0)
              (if (equal (plist-get best :state) "waiting_input") " ?" "")))))

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
  (keel-mode-line-mode 1))

(provide 'keel)
;;; keel.el ends here
