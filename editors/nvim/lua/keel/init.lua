-- keel for Neovim (0.7+): starts `keel serve` for mission files and talks to it.
--
-- Everything here is built on the protocol in keel's docs/lsp.md: the `keel/missions` and
-- `keel/restorePoints` requests, the `keel.*` commands and `keel/missionChanged` (the statusline, and a
-- message when a mission ends). It depends on nothing but Neovim's own LSP client, and runs on 0.7.2 as
-- on current releases.
local M = {}

M.config = {
  cmd = { "keel", "serve" }, -- how to start the language server
  filetypes = { "toml" }, -- mission files are TOML
  store = nil, -- a store folder; default: the server's choice (<workspace>/.keel/store)
  autostart = true, -- start the server in mission files (see M.is_mission_buffer)
}

M.missions = {} -- id -> MissionSummary, from keel/missions and keel/missionChanged
M.finished = nil -- the id of the mission last seen finishing (keel/missionChanged), for the statusline

local ACTIVE = { running = true, pausing = true, waiting_input = true, paused = true, offline = true }
local FINISHED = { completed = vim.log.levels.INFO, failed = vim.log.levels.ERROR, cancelled = vim.log.levels.WARN }

local function has(version)
  return vim.fn.has("nvim-" .. version) == 1
end

local function notify(text, level)
  vim.notify(text, level or vim.log.levels.INFO)
end

--- The running keel client, initialized (the first one when several workspaces have one), or nil.
function M.client()
  local list
  if vim.lsp.get_clients then
    list = vim.lsp.get_clients({ name = "keel" })
  else
    list = vim.lsp.get_active_clients()
  end
  for _, c in ipairs(list) do
    if c.name == "keel" and c.initialized then
      return c
    end
  end
  return nil
end

local started = {} -- ids of the keel clients M.start started

--- A keel client that was started and is not up yet (its server still starting), or nil.
function M.starting()
  for _, id in ipairs(started) do
    local c = vim.lsp.get_client_by_id(id)
    if c and not c.initialized then
      return c
    end
  end
  return nil
end

--- Runs fn once a keel client is up; says so when the server it waits for stops or takes too long.
function M.when_ready(fn, timeout_ms)
  local deadline = vim.loop.now() + (timeout_ms or 60000)
  local function tick()
    if M.client() then
      return fn()
    end
    if not M.starting() then
      return notify("keel: the keel language server stopped before it was up (see :LspLog)", vim.log.levels.ERROR)
    end
    if vim.loop.now() > deadline then
      return notify("keel: the keel language server is still not up; nothing was sent", vim.log.levels.ERROR)
    end
    vim.defer_fn(tick, 50)
  end
  vim.defer_fn(tick, 0)
end

-- client:request on 0.11+, where the dot form is deprecated; client.request before.
local function send(client, method, params, handler)
  if has("0.11") then
    return client:request(method, params, handler, 0)
  end
  return client.request(method, params, handler, 0)
end

--- Sends a request to keel and waits for its answer; raises the server's error message.
function M.request(method, params, timeout_ms)
  local client = M.client()
  if not client then
    error("keel: no keel language server is running (open a mission file, or run :Keel start FILE)", 0)
  end
  local reply
  send(client, method, params, function(err, result)
    reply = { err = err, result = result }
  end)
  if not vim.wait(timeout_ms or 15000, function()
    return reply ~= nil
  end, 10) then
    error("keel: " .. method .. " got no answer", 0)
  end
  if reply.err then
    error("keel: " .. tostring(reply.err.message), 0)
  end
  return reply.result
end

--- Runs a `keel.*` command (workspace/executeCommand) and returns its result.
function M.command(name, arguments)
  return M.request("workspace/executeCommand", { command = name, arguments = arguments })
end

--- Every mission, oldest first; refreshes M.missions.
function M.list_missions(timeout_ms)
  local list = M.request("keel/missions", vim.empty_dict(), timeout_ms) or {}
  for _, summary in ipairs(list) do
    M.missions[summary.id] = summary
  end
  return list
end

local function remember(summary)
  if type(summary) == "table" and summary.id then
    M.missions[summary.id] = summary
  end
  return summary
end

function M.start_mission(file)
  return remember(M.command("keel.startMission", { file }))
end

-- The state a command answers with: the acknowledged transition (`pausing`) or, from an older server,
-- the state the mission was in. Either is shown as it is; keel/missionChanged brings the rest.
function M.pause(id)
  return remember(M.command("keel.pause", { id }))
end

function M.resume(id)
  return remember(M.command("keel.resume", { id }))
end

function M.answer(id, text)
  return remember(M.command("keel.answer", { id, text }))
end

function M.points(id)
  return M.request("keel/restorePoints", { id = id }) or {}
end

function M.restore(id, point, files)
  local arguments = { id, point }
  if files then
    arguments[3] = { files = true }
  end
  return remember(M.command("keel.restore", arguments))
end

local function describe(summary)
  local text = string.format("%s (%s) %s", summary.name, summary.id, summary.state)
  if summary.pauseReason and summary.state == "paused" then
    text = text .. " (" .. summary.pauseReason .. ")"
  end
  if summary.question then
    text = text .. " — asks: " .. summary.question.text
    if summary.question.choices and #summary.question.choices > 0 then
      text = text .. " [" .. table.concat(summary.question.choices, "/") .. "]"
    end
  end
  if summary.error and summary.error ~= "" then
    text = text .. " — " .. summary.error
  end
  return text
end
M.describe = describe

-- The newest mission that is not finished, else the one last seen finishing: for the statusline.
local function current_mission()
  local best
  for _, s in pairs(M.missions) do
    if ACTIVE[s.state] and (best == nil or (s.updatedAt or 0) > (best.updatedAt or 0)) then
      best = s
    end
  end
  return best or (M.finished and M.missions[M.finished])
end

--- A mission's state in words with its units done of all: `running 2/5 40% · u3 Rewrite imports`,
--- `waiting for an answer 2/5 40%`, `paused (operator) 2/5 40%`, `completed 5/5 100%`.
function M.state_text(summary)
  local units = summary.units or {}
  local done, total = units.done or 0, units.total or 0
  local count = string.format("%d/%d %d%%", done, total, total > 0 and math.floor(done * 100 / total) or 0)
  local state = summary.state
  if state == "running" or state == "pausing" then
    local unit = vim.trim((summary.currentUnit or "") .. " " .. (summary.currentUnitTitle or ""))
    return state .. " " .. count .. (unit ~= "" and (" · " .. unit) or "")
  elseif state == "waiting_input" then
    return "waiting for an answer " .. count
  elseif state == "created" then
    return "starting"
  elseif summary.pauseReason and summary.pauseReason ~= state and (state == "paused" or state == "offline") then
    return state .. " (" .. summary.pauseReason .. ") " .. count
  end
  return state .. " " .. count
end

--- A short statusline text: the newest unfinished mission (else the one last seen finishing) and how far
--- it is ("" when none). Works on every version; on 0.10+ `vim.lsp.status()` shows keel's $/progress too.
function M.statusline()
  local summary = current_mission()
  if not summary then
    return ""
  end
  return string.format("keel %s %s", summary.name, M.state_text(summary))
end

local function redraw()
  vim.schedule(function()
    vim.cmd("redrawstatus!")
  end)
end

-- keel · <name> asks: <text> (docs/lsp.md) -> the waiting mission it is about.
local function asking_mission(message)
  local text = message:match(" asks: (.*)$")
  local found = {}
  local function scan()
    for id, s in pairs(M.missions) do
      if s.state == "waiting_input" and s.question and s.question.text == text then
        found[#found + 1] = id
      end
    end
  end
  scan()
  if #found == 0 then
    pcall(M.list_missions, 5000)
    scan()
  end
  return #found == 1 and found[1] or nil
end

local function ask(message, actions)
  local id = asking_mission(message)
  if not id then
    notify(message .. " — answer with :Keel answer ID TEXT")
    return
  end
  local titles = vim.tbl_map(function(a)
    return a.title
  end, actions)
  vim.ui.select(titles, { prompt = message }, function(choice)
    if choice then
      local ok, result = pcall(M.answer, id, choice)
      notify(ok and describe(result) or result, ok and vim.log.levels.INFO or vim.log.levels.ERROR)
    end
  end)
end

local announced = {} -- mission id -> the end this plugin announced

-- A mission this client saw unfinished that now is: say how it ended.
local function announce(before, summary)
  local level = FINISHED[summary.state]
  if before and not FINISHED[before.state] and level then
    M.finished = summary.id
    announced[summary.id] = summary.state
    notify("keel: " .. describe(summary), level)
  end
end

-- keel serve's own "keel: mission NAME (ID) failed: …" follows the keel/missionChanged that brought the
-- failure (docs/lsp.md): dropped when the plugin said it already.
local function show_message(err, result, ctx, config)
  local text = type(result) == "table" and type(result.message) == "string" and result.message or ""
  local id = text:match("^keel: mission .- %((m%w+)%) failed: ")
  if id and announced[id] == "failed" then
    return
  end
  return vim.lsp.handlers["window/showMessage"](err, result, ctx, config)
end

local function handlers()
  return {
    ["keel/missionChanged"] = function(_, summary)
      local before = type(summary) == "table" and M.missions[summary.id]
      remember(summary)
      announce(before, summary)
      redraw()
    end,
    ["window/showMessage"] = show_message,
    -- A question is answered through keel.answer once picked: the request itself is answered at once
    -- (null, "dismissed"), so a pending pick never blocks the editor or the server.
    ["window/showMessageRequest"] = function(_, params)
      vim.schedule(function()
        ask(params.message, params.actions or {})
      end)
      return vim.NIL
    end,
  }
end

local function root_dir(bufnr)
  local file = vim.api.nvim_buf_get_name(bufnr)
  local start = file ~= "" and vim.fn.fnamemodify(file, ":p:h") or vim.fn.getcwd()
  local keel_dir = vim.fn.finddir(".keel", start .. ";")
  if keel_dir ~= "" then
    return vim.fn.fnamemodify(keel_dir, ":p:h:h")
  end
  return start
end

--- Whether a buffer is a mission file: a `[mission]` table, or a workspace that has a .keel folder.
function M.is_mission_buffer(bufnr)
  for _, line in ipairs(vim.api.nvim_buf_get_lines(bufnr, 0, 200, false)) do
    if line:match("^%s*%[mission%]") then
      return true
    end
  end
  local file = vim.api.nvim_buf_get_name(bufnr)
  local start = file ~= "" and vim.fn.fnamemodify(file, ":p:h") or vim.fn.getcwd()
  return vim.fn.finddir(".keel", start .. ";") ~= ""
end

--- Starts (or reuses) the keel client for a buffer's workspace and attaches it; returns the client id.
function M.start(bufnr)
  bufnr = (bufnr == nil or bufnr == 0) and vim.api.nvim_get_current_buf() or bufnr
  local root = root_dir(bufnr)
  local config = {
    name = "keel",
    cmd = M.config.cmd,
    root_dir = root,
    handlers = handlers(),
    init_options = M.config.store and { store = M.config.store } or vim.empty_dict(),
  }
  local id
  if vim.lsp.start then -- 0.8+
    id = vim.lsp.start(config, { bufnr = bufnr })
  else -- 0.7: one client per workspace, also while it is starting (not yet among the active ones)
    local known = vim.tbl_map(vim.lsp.get_client_by_id, started)
    for _, c in ipairs(vim.list_extend(vim.lsp.get_active_clients(), known)) do
      if c.name == "keel" and c.config.root_dir == root then
        vim.lsp.buf_attach_client(bufnr, c.id)
        return c.id
      end
    end
    id = vim.lsp.start_client(config)
    if id then
      vim.lsp.buf_attach_client(bufnr, id)
    end
  end
  if id and not vim.tbl_contains(started, id) then
    started[#started + 1] = id
  end
  return id
end

--- Starts the keel client for a file's workspace (loading the file into a buffer), for a :Keel command
--- given before any keel server runs; returns the client id.
function M.start_for_file(file)
  local bufnr = vim.fn.bufadd(file)
  vim.fn.bufload(bufnr) -- its FileType may start the client already (M.start finds it then)
  return M.start(bufnr)
end

function M.setup(opts)
  M.config = vim.tbl_extend("force", M.config, opts or {})
  local group = vim.api.nvim_create_augroup("keel", { clear = true })
  if M.config.autostart then
    vim.api.nvim_create_autocmd("FileType", {
      group = group,
      pattern = M.config.filetypes,
      callback = function(args)
        if M.is_mission_buffer(args.buf) then
          M.start(args.buf)
        end
      end,
    })
  end
  -- 0.10+ announces progress with LspProgress, 0.7-0.9 with User LspProgressUpdate
  if has("0.10") then
    vim.api.nvim_create_autocmd("LspProgress", { group = group, callback = redraw })
  else
    vim.api.nvim_create_autocmd("User", { group = group, pattern = "LspProgressUpdate", callback = redraw })
  end
end

return M
