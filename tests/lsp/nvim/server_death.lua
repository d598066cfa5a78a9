-- The server dies mid-session: the status says so with the reason, one error message (not a
-- loop), and :FlywheelRestart brings the server back for the open buffer.
local T = dofile(vim.fn.fnamemodify(debug.getinfo(1, "S").source:sub(2), ":h") .. "/common.lua")

T.run(function()
  local errors = {}
  local notify = vim.notify
  vim.notify = function(msg, level, ...)
    if level == vim.log.levels.ERROR then
      table.insert(errors, msg)
    end
    return notify(msg, level, ...)
  end
  T.start()
  local fw = require("flywheel")
  local first = T.client().id
  vim.fn.system({ "pkill", "-9", "-f", T.cfg.marker })
  T.wait("the stopped status", 120000, function() return fw.state.status.state == "stopped" end)
  vim.wait(500) -- any repeated error message would arrive now
  T.results.statusline = fw.statusline()
  T.results.errors = errors
  vim.cmd("FlywheelRestart")
  T.wait("the restarted server", 120000, function()
    local c = vim.lsp.get_clients({ name = "flywheel", bufnr = 0 })[1]
    return c ~= nil and c.id ~= first and c.initialized
  end)
  T.results.answer = T.request("workspace/executeCommand", { command = "flywheel.status", arguments = {} })
end)
