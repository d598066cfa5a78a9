-- An agent task from :FlywheelAsk with a real model: the task ends (the model's answer is its
-- own), its proposal is previewed as hunks, and :FlywheelAcceptAll applies it to the buffer.
local T = dofile(vim.fn.fnamemodify(debug.getinfo(1, "S").source:sub(2), ":h") .. "/common.lua")

T.run(function()
  T.start()
  local fw = require("flywheel")
  local before = vim.api.nvim_buf_get_lines(0, 0, -1, false)
  vim.cmd("FlywheelAsk " .. T.cfg.question)
  T.wait("the task to finish", 540000, function()
    return next(fw.state.tasks) ~= nil
  end)
  local _, task = next(fw.state.tasks)
  T.results.task = task
  T.results.preview_marks = #vim.api.nvim_buf_get_extmarks(0, fw.ns, 0, -1, {})
  if #(task.proposals or {}) > 0 then
    vim.api.nvim_win_set_cursor(0, { 1, 0 })
    vim.cmd("FlywheelNextHunk")
    vim.cmd("FlywheelAcceptAll")
    T.wait("the proposal applied", 60000, function()
      return not vim.deep_equal(vim.api.nvim_buf_get_lines(0, 0, -1, false), before)
    end)
    T.wait("the preview cleared", 60000, function()
      return #vim.api.nvim_buf_get_extmarks(0, fw.ns, 0, -1, {}) == 0
    end)
  end
  T.results.lines = vim.api.nvim_buf_get_lines(0, 0, -1, false)
end)
