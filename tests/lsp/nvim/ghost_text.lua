-- Ghost text from the server, accepted with Neovim's native inline completion.
local T = dofile(vim.fn.fnamemodify(debug.getinfo(1, "S").source:sub(2), ":h") .. "/common.lua")

T.run(function()
  T.start()
  local ns = vim.api.nvim_create_namespace("nvim.lsp.inline_completion")
  local before = vim.api.nvim_buf_get_lines(0, 0, -1, false)
  vim.api.nvim_win_set_cursor(0, { 2, 0 })
  T.insert() -- at the end of line 2
  T.wait("ghost text", 120000, function()
    return #vim.api.nvim_buf_get_extmarks(0, ns, 0, -1, {}) > 0
  end)
  local mark = vim.api.nvim_buf_get_extmarks(0, ns, 0, -1, { details = true })[1]
  T.results.ghost_row = mark[2]
  T.results.mode = vim.api.nvim_get_mode().mode
  assert(vim.lsp.inline_completion.get(), "no ghost text to accept")
  T.wait("the accepted text", 120000, function()
    return not vim.deep_equal(vim.api.nvim_buf_get_lines(0, 0, -1, false), before)
  end)
  T.results.before = before
  T.results.after = vim.api.nvim_buf_get_lines(0, 0, -1, false)
  vim.cmd("stopinsert")
  -- The item's command (flywheel.acceptCompletion) runs after the insert; the status request
  -- below is answered after it (the server answers in order), so telemetry has it once flushed.
  T.request("workspace/executeCommand", { command = "flywheel.status", arguments = {} })
end)
