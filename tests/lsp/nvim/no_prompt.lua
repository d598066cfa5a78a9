-- In a real terminal (tmux): :FlywheelAsk streams multi-line steps and a multi-line answer, and
-- Neovim must never stop at "Press ENTER". The statusline is the plugin's; every value it showed
-- is recorded. When the task is done and the screen redrawn, tmux's channel `cfg.ready` is
-- signalled; the test captures the screen, then creates `cfg.captured` and the script ends.
local T = dofile(vim.fn.fnamemodify(debug.getinfo(1, "S").source:sub(2), ":h") .. "/common.lua")

vim.o.laststatus = 2
vim.o.statusline = "%!v:lua.require'flywheel'.statusline()"
T.results.statuslines = {}
vim.api.nvim_create_autocmd("User", {
  pattern = "FlywheelStatus",
  callback = function() table.insert(T.results.statuslines, require("flywheel").statusline()) end,
})

T.run(function()
  local fw = require("flywheel")
  T.results.before_first_status = fw.statusline()
  T.start()
  T.request("flywheel/test/replay", { turns = T.cfg.turns })
  vim.cmd("FlywheelAsk what does this file do")
  T.wait("the task to finish", 120000, function()
    return next(fw.state.tasks) ~= nil
  end)
  T.wait("the server to be idle", 120000, function()
    return fw.state.status.state == "idle"
  end)
  vim.cmd("redraw!")
  T.results.mode = vim.api.nvim_get_mode().mode
  vim.fn.system({ "tmux", "-S", T.cfg.socket, "wait-for", "-S", T.cfg.ready })
  T.wait("the screen to be captured", 120000, function()
    return vim.uv.fs_stat(T.cfg.captured) ~= nil
  end)
  T.results.steps_text = vim.api.nvim_buf_get_lines(vim.fn.bufnr("flywheel://steps"), 0, -1, false)
end)
