-- A first start (the server converts its base): the statusline reads "starting", then the
-- preparation's percentage, then the model; Neovim's own vim.lsp.status() sees the progress; the
-- plugin shows it as a progress message (nvim_echo, recorded here) without a statusline set up.
local T = dofile(vim.fn.fnamemodify(debug.getinfo(1, "S").source:sub(2), ":h") .. "/common.lua")

T.results.statuslines = {}
T.results.lsp_status = {}
vim.api.nvim_create_autocmd("User", {
  pattern = "FlywheelStatus",
  callback = function() table.insert(T.results.statuslines, require("flywheel").statusline()) end,
})
vim.api.nvim_create_autocmd("LspProgress", {
  callback = function() table.insert(T.results.lsp_status, vim.lsp.status()) end,
})

T.results.echoes = {}
local echo = vim.api.nvim_echo
vim.api.nvim_echo = function(chunks, history, opts)
  opts = opts or {}
  table.insert(T.results.echoes, { text = chunks[1][1], kind = opts.kind or vim.NIL,
    status = opts.status or vim.NIL, percent = opts.percent or vim.NIL, history = history })
  return echo(chunks, history, opts)
end

T.run(function()
  local fw = require("flywheel")
  T.results.before_first_status = fw.statusline()
  T.start()
  T.wait("the model to be ready", 120000, function()
    return fw.state.status.state == "idle"
  end)
  T.results.final = fw.statusline()
end)
