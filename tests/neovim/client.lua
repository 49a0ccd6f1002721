-- A real Neovim (0.7+) LSP client for keel serve: start a mission, see keel/missionChanged, pause it.
-- Reads KEEL_NVIM_PYTHON, KEEL_NVIM_STORE, KEEL_NVIM_MISSION, KEEL_NVIM_OUT from the environment and
-- writes what it saw as JSON to KEEL_NVIM_OUT; exits 0 on success, 1 otherwise.
local out = os.getenv("KEEL_NVIM_OUT")
local seen = { changes = {}, errors = {} }

local function finish(ok)
  seen.ok = ok
  local f = io.open(out, "w")
  f:write(vim.fn.json_encode(seen))
  f:close()
  os.exit(ok and 0 or 1)
end

local id = vim.lsp.start_client({
  name = "keel",
  cmd = { os.getenv("KEEL_NVIM_PYTHON"), "-m", "keel.server.cli", "serve", "--store", os.getenv("KEEL_NVIM_STORE") },
  root_dir = vim.fn.getcwd(),
  handlers = {
    ["keel/missionChanged"] = function(_, summary)
      table.insert(seen.changes, { id = summary.id, state = summary.state })
    end,
  },
})
if not id then
  seen.errors[#seen.errors + 1] = "start_client failed"
  finish(false)
end
vim.lsp.buf_attach_client(0, id)
local client = vim.lsp.get_client_by_id(id)
if not vim.wait(10000, function() return client.initialized end, 20) then
  seen.errors[#seen.errors + 1] = "server did not initialize"
  finish(false)
end

local function command(name, args)
  local reply
  client.request("workspace/executeCommand", { command = name, arguments = args }, function(err, result)
    reply = { err = err, result = result }
  end, 0)
  if not vim.wait(30000, function() return reply ~= nil end, 20) then
    seen.errors[#seen.errors + 1] = name .. " got no answer"
    finish(false)
  end
  if reply.err then
    seen.errors[#seen.errors + 1] = name .. ": " .. tostring(reply.err.message)
    finish(false)
  end
  return reply.result
end

local function saw(mission, state)
  return function()
    for _, c in ipairs(seen.changes) do
      if c.id == mission and c.state == state then return true end
    end
    return false
  end
end

local started = command("keel.startMission", { os.getenv("KEEL_NVIM_MISSION") })
seen.mission = started.id
if not vim.wait(20000, saw(started.id, "running"), 20) then
  seen.errors[#seen.errors + 1] = "no keel/missionChanged with state running"
  finish(false)
end
local paused = command("keel.pause", { started.id })
seen.pause_result = paused.state
if not vim.wait(20000, saw(started.id, "paused"), 20) then
  seen.errors[#seen.errors + 1] = "no keel/missionChanged with state paused"
  finish(false)
end
client.stop()
finish(true)
