-- Drives editors/nvim as a user would, after the README's init.lua: open a mission file, :Keel start,
-- complete a mission id, :Keel pause, :Keel resume, pick the answer to the first question when it is
-- offered, complete and :Keel answer the second, :Keel points, :Keel restore, :Keel missions, then :Keel start
-- the mission in KEEL_EDITOR_FAILING, which fails. Reads KEEL_EDITOR_MISSION, KEEL_EDITOR_FAILING and
-- KEEL_EDITOR_OUT; writes what it saw as JSON to KEEL_EDITOR_OUT and exits 0 when every step passed.
local out = os.getenv("KEEL_EDITOR_OUT")
local seen = { notes = {}, prompts = {}, statusline = {}, errors = {}, version = tostring(vim.version()) }

local function finish(ok)
  seen.ok = ok
  local f = assert(io.open(out, "w"))
  f:write(vim.fn.json_encode(seen))
  f:close()
  os.exit(ok and 0 or 1)
end

local function fail(what)
  seen.errors[#seen.errors + 1] = what
  finish(false)
end

-- The editor's own UI hooks, as a user's picker plugin would replace them: record; answer the first
-- question "yes" when offered, dismiss the second (it is answered with :Keel answer).
vim.notify = function(text)
  seen.notes[#seen.notes + 1] = text
end
vim.ui.select = function(items, opts, on_choice)
  seen.prompts[#seen.prompts + 1] = { prompt = opts.prompt, items = items }
  on_choice(opts.prompt == "keel · ship asks: Ship it?" and "yes" or nil)
end

-- What Neovim's own progress support saw of keel's $/progress: vim.lsp.status() on 0.10+ (LspProgress),
-- the progress messages of 0.7-0.9 (User LspProgressUpdate).
seen.lsp_progress = {}
local function record_progress()
  local text = vim.lsp.status and vim.lsp.status()
    or table.concat(vim.tbl_map(function(p)
      return (p.title or "") .. ": " .. (p.message or "")
    end, vim.lsp.util.get_progress_messages()), ", ")
  if text ~= "" then
    seen.lsp_progress[#seen.lsp_progress + 1] = text
  end
end
if vim.fn.exists("##LspProgress") == 1 then
  vim.api.nvim_create_autocmd("LspProgress", { callback = record_progress })
else
  vim.api.nvim_create_autocmd("User", { pattern = "LspProgressUpdate", callback = record_progress })
end

local ok, err = xpcall(function()
  local keel = require("keel")
  vim.cmd("edit " .. vim.fn.fnameescape(os.getenv("KEEL_EDITOR_MISSION")))
  if not vim.wait(20000, function()
    local c = keel.client()
    return c ~= nil and c.initialized
  end, 20) then
    fail("opening the mission file started no keel client")
  end

  local watched -- the mission waited on

  local function wait_for(what, condition)
    if not vim.wait(60000, condition, 20) then
      fail(what .. " (" .. vim.inspect(keel.missions[watched]) .. ")")
    end
  end

  local function wait_state(state, question)
    wait_for("mission never reached " .. state, function()
      local s = keel.missions[watched]
      if s and s.state == state and (not question or (s.question and s.question.text == question)) then
        seen.statusline[state] = keel.statusline()
        return true
      end
      return false
    end)
  end

  vim.cmd("Keel start")
  local started = assert(keel.missions and next(keel.missions) and select(2, next(keel.missions)))
  seen.mission = started.id
  watched = started.id
  wait_state("running")
  wait_for("keel/missionChanged never named the running unit", function()
    return keel.missions[seen.mission].currentUnit ~= nil
  end)
  seen.statusline.unit = keel.statusline()

  seen.complete_sub = vim.fn.getcompletion("Keel pa", "cmdline")
  seen.complete_id = vim.fn.getcompletion("Keel pause ", "cmdline")
  vim.cmd("Keel pause " .. seen.mission)
  seen.pause_note = seen.notes[#seen.notes]
  wait_state("paused")

  vim.cmd("Keel resume " .. seen.mission:sub(1, 12))
  seen.resume_note = seen.notes[#seen.notes]
  wait_state("waiting_input", "Really?")
  if not vim.wait(20000, function()
    return #seen.prompts > 1
  end, 20) then
    fail("the questions were not both offered: " .. vim.inspect(seen.prompts))
  end

  seen.complete_choice = vim.fn.getcompletion("Keel answer " .. seen.mission .. " ", "cmdline")
  vim.cmd("Keel answer " .. seen.mission .. " yes")
  seen.answer_note = seen.notes[#seen.notes]
  wait_state("completed")

  vim.cmd("Keel points " .. seen.mission)
  seen.points_note = seen.notes[#seen.notes]
  seen.complete_point = vim.fn.getcompletion("Keel restore " .. seen.mission .. " ", "cmdline")
  vim.cmd("Keel restore " .. seen.mission .. " p2")
  seen.restore_note = seen.notes[#seen.notes]
  wait_state("paused")
  vim.cmd("Keel missions")
  seen.missions_note = seen.notes[#seen.notes]
  vim.cmd("Keel pause m-no-such-mission")
  seen.error_note = seen.notes[#seen.notes]

  vim.cmd("Keel start " .. vim.fn.fnameescape(os.getenv("KEEL_EDITOR_FAILING")))
  seen.failing = seen.notes[#seen.notes]:match("%((m%w+)%)")
  watched = seen.failing
  wait_state("failed")
end, debug.traceback)
if not ok then
  fail(tostring(err))
end
finish(true)
