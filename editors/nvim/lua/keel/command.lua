-- The :Keel command and its completion: subcommands, mission ids, a question's choices, restore points.
-- Uses only require("keel"); nothing here talks to the server directly.
local keel = require("keel")

local C = {}

local SUBCOMMANDS = { "missions", "start", "pause", "resume", "answer", "points", "restore" }

-- Which missions each subcommand offers first (all of them when none is in such a state).
local WANTED = {
  pause = { running = true, waiting_input = true, offline = true },
  resume = { paused = true, offline = true, pausing = true },
  answer = { waiting_input = true },
}

local function say(text, level)
  vim.notify(text, level or vim.log.levels.INFO)
end

local function missions_for(sub)
  local ok = pcall(keel.list_missions, 2000)
  local all = {}
  for _, s in pairs(keel.missions) do
    all[#all + 1] = s
  end
  table.sort(all, function(a, b)
    return (a.createdAt or 0) < (b.createdAt or 0)
  end)
  local wanted = WANTED[sub]
  if wanted then
    local some = vim.tbl_filter(function(s)
      return wanted[s.state]
    end, all)
    if #some > 0 then
      return some, ok
    end
  end
  return all, ok
end

local function starting(list, lead)
  return vim.tbl_filter(function(item)
    return item:sub(1, #lead) == lead
  end, list)
end

--- Completion for :Keel (a customlist function).
function C.complete(lead, line, _)
  local words = vim.split(line:sub(1, #line - #lead), "%s+", { trimempty = true })
  local n = #words -- words before the one being completed, the command name included
  if n == 1 then
    return starting(SUBCOMMANDS, lead)
  end
  local sub = words[2]
  if n == 2 and sub == "start" then
    return vim.fn.getcompletion(lead, "file")
  end
  if n == 2 and sub ~= "missions" then
    local list = missions_for(sub)
    return starting(
      vim.tbl_map(function(s)
        return s.id
      end, list),
      lead
    )
  end
  if n == 3 and sub == "answer" then
    local s = keel.missions[words[3]]
    return starting((s and s.question and s.question.choices) or {}, lead)
  end
  if n == 3 and sub == "restore" then
    local ok, points = pcall(keel.points, words[3])
    return starting(
      ok and vim.tbl_map(function(p)
        return p.id
      end, points) or {},
      lead
    )
  end
  if n == 4 and sub == "restore" then
    return starting({ "files" }, lead)
  end
  return {}
end

-- Runs fn(id) with the mission id given, or one picked from the missions `sub` is about.
local function with_mission(sub, id, fn)
  if id then
    return fn(id)
  end
  local list = missions_for(sub)
  if #list == 0 then
    say("keel: no missions in this store", vim.log.levels.WARN)
    return
  end
  vim.ui.select(list, { prompt = "keel " .. sub .. ": ", format_item = keel.describe }, function(choice)
    if choice then
      fn(choice.id)
    end
  end)
end

local function answer(id, text)
  if text and text ~= "" then
    return say(keel.describe(keel.answer(id, text)))
  end
  local s = keel.missions[id]
  local question = s and s.question
  if not question then
    return say("keel: mission " .. id .. " asks nothing; answer with :Keel answer ID TEXT", vim.log.levels.WARN)
  end
  local function send(choice)
    if choice and choice ~= "" then
      say(keel.describe(keel.answer(id, choice)))
    end
  end
  if question.choices and #question.choices > 0 then
    vim.ui.select(question.choices, { prompt = question.text }, send)
  else
    vim.ui.input({ prompt = question.text .. " " }, send)
  end
end

local RUN = {
  missions = function()
    local list = keel.list_missions()
    if #list == 0 then
      return say("keel: no missions in this store")
    end
    say(table.concat(vim.tbl_map(keel.describe, list), "\n"))
  end,
  start = function(args)
    local file = args[1] or vim.api.nvim_buf_get_name(0)
    say(keel.describe(keel.start_mission(vim.fn.fnamemodify(file, ":p"))))
  end,
  pause = function(args)
    with_mission("pause", args[1], function(id)
      say(keel.describe(keel.pause(id)))
    end)
  end,
  resume = function(args)
    with_mission("resume", args[1], function(id)
      say(keel.describe(keel.resume(id)))
    end)
  end,
  answer = function(args)
    with_mission("answer", args[1], function(id)
      answer(id, table.concat(args, " ", 2))
    end)
  end,
  points = function(args)
    with_mission("points", args[1], function(id)
      local lines = vim.tbl_map(function(p)
        return string.format("%s  %s%s", p.id, p.reason, p.label ~= "" and ("  [" .. p.label .. "]") or "")
      end, keel.points(id))
      say(#lines > 0 and table.concat(lines, "\n") or ("keel: mission " .. id .. " has no restore points"))
    end)
  end,
  restore = function(args)
    if not args[2] then
      return say("keel: usage: :Keel restore ID POINT [files]", vim.log.levels.ERROR)
    end
    say(keel.describe(keel.restore(args[1], args[2], args[3] == "files")))
  end,
}

local function go(run, args)
  local ok, err = pcall(run, args)
  if not ok then
    say(tostring(err), vim.log.levels.ERROR)
  end
end

-- The client a command given before any keel server is up waits for: one starting already (the mission
-- file was just opened), or, for :Keel start, one started now for the file to start.
local function waiting_client(sub, args)
  local starting = keel.starting()
  if starting or sub ~= "start" then
    return starting
  end
  local file = vim.fn.fnamemodify(args[1], ":p")
  if vim.fn.filereadable(file) == 1 and keel.start_for_file(file) then
    return keel.starting() or keel.client()
  end
  return nil
end

--- :Keel {subcommand} [args]: errors are shown as one message, never a traceback. Given while the
--- language server is still starting, the command runs as soon as it is up (and says so now).
function C.run(opts)
  local args = opts.fargs
  local sub = table.remove(args, 1) or "missions"
  local run = RUN[sub]
  if not run then
    return say("keel: unknown subcommand '" .. sub .. "' (" .. table.concat(SUBCOMMANDS, ", ") .. ")", vim.log.levels.ERROR)
  end
  if sub == "start" and not args[1] then
    args[1] = vim.api.nvim_buf_get_name(0) -- this buffer's file, also when the command runs later
  end
  if not keel.client() and waiting_client(sub, args) then
    say("keel: the keel language server is starting; :Keel " .. sub .. " runs as soon as it is up")
    return keel.when_ready(function()
      go(run, args)
    end)
  end
  go(run, args)
end

return C
