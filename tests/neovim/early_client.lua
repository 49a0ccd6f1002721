-- :Keel start given before the keel language server is up, after the README's init.lua: right after
-- opening the mission file (KEEL_EDITOR_SCENARIO "opened": its server is starting), or from an empty
-- buffer naming the file (anything else: no server at all yet). Writes the notes it saw and the missions
-- as JSON to KEEL_EDITOR_OUT; exits 0 once a mission completed.
local out = os.getenv("KEEL_EDITOR_OUT")
local mission = os.getenv("KEEL_EDITOR_MISSION")
local seen = { notes = {}, missions = {} }

vim.notify = function(text)
  seen.notes[#seen.notes + 1] = text
end

local keel = require("keel")
if os.getenv("KEEL_EDITOR_SCENARIO") == "opened" then
  vim.cmd("edit " .. vim.fn.fnameescape(mission))
  seen.up_before = keel.client() ~= nil
  vim.cmd("Keel start")
else
  seen.up_before = keel.client() ~= nil
  vim.cmd("Keel start " .. vim.fn.fnameescape(mission))
end
local done = vim.wait(90000, function()
  for _, s in pairs(keel.missions) do
    if s.state == "completed" then
      return true
    end
  end
  return false
end, 20)
for _, s in pairs(keel.missions) do
  seen.missions[#seen.missions + 1] = { id = s.id, state = s.state }
end
local f = assert(io.open(out, "w"))
f:write(vim.fn.json_encode(seen))
f:close()
os.exit(done and 0 or 1)
