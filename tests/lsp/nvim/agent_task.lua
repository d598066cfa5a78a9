-- An agent task from :FlywheelAsk: steps stream, hunks preview, one accepted, one rejected.
local T = dofile(vim.fn.fnamemodify(debug.getinfo(1, "S").source:sub(2), ":h") .. "/common.lua")

T.run(function()
  T.start()
  local fw = require("flywheel")
  T.request("flywheel/test/replay", { turns = T.cfg.turns })
  vim.cmd("FlywheelAsk fix the operators")
  T.wait("the task to finish", 120000, function()
    return next(fw.state.tasks) ~= nil
  end)
  local _, task = next(fw.state.tasks)
  T.results.task = task
  T.results.steps = fw.state.steps
  T.results.preview_marks = #vim.api.nvim_buf_get_extmarks(0, fw.ns, 0, -1, {})

  vim.api.nvim_win_set_cursor(0, { 1, 0 })
  vim.cmd("FlywheelNextHunk")
  T.results.first_hunk_line = vim.api.nvim_win_get_cursor(0)[1]
  local before = vim.api.nvim_buf_get_lines(0, 0, -1, false)
  vim.cmd("FlywheelAcceptHunk")
  T.wait("the accepted hunk in the buffer", 120000, function()
    return not vim.deep_equal(vim.api.nvim_buf_get_lines(0, 0, -1, false), before)
  end)
  local pid = task.proposals[1].proposalId
  T.wait("the accept to finish", 120000, function()
    return fw.state.proposals[pid].hunks[1].state == "accepted"
  end)
  vim.cmd("FlywheelNextHunk")
  T.results.second_hunk_line = vim.api.nvim_win_get_cursor(0)[1]
  vim.cmd("FlywheelRejectHunk")
  T.wait("the reject to finish", 120000, function()
    return fw.state.proposals[pid].hunks[2].state == "rejected"
  end)
  T.results.preview_marks_after = #vim.api.nvim_buf_get_extmarks(0, fw.ns, 0, -1, {})
  T.results.lines = vim.api.nvim_buf_get_lines(0, 0, -1, false)
  vim.cmd("FlywheelRate 1 good fix")
  T.request("workspace/executeCommand", { command = "flywheel.status", arguments = {} })
end)
