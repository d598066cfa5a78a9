-- A next edit whose text moved on: typing elsewhere discards it (rejected, the drawing gone), and
-- Tab afterwards changes nothing.
local T = dofile(vim.fn.fnamemodify(debug.getinfo(1, "S").source:sub(2), ":h") .. "/common.lua")

T.run(function()
  T.start()
  local S = require("flywheel.suggestions")
  vim.api.nvim_buf_set_lines(0, 4, 5, false, { "def mul(a, b):  # times" }) -- an edit
  vim.cmd("FlywheelNextEdit")
  T.wait("a next edit", 120000, function() return S.state.next_edit ~= nil end)
  T.results.marks = #vim.api.nvim_buf_get_extmarks(0, S.ns, 0, -1, {})
  vim.api.nvim_buf_set_lines(0, 0, 0, false, { "# a comment typed meanwhile" })
  T.wait("the stale next edit to go", 120000, function() return S.state.next_edit == nil end)
  T.results.marks_after = #vim.api.nvim_buf_get_extmarks(0, S.ns, 0, -1, {})
  T.results.tab_handled = S.tab()
  vim.wait(300)
  T.results.lines = vim.api.nvim_buf_get_lines(0, 0, -1, false)
end)
