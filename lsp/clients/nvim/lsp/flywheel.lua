-- Flywheel's language-server configuration for Neovim 0.11+. With this folder's parent on the
-- runtimepath, `vim.lsp.config("flywheel", {...})` merges your settings over it and
-- `vim.lsp.enable("flywheel")` starts `flywheel lsp`. Loading it also sets up the plugin with
-- its defaults (commands, keymaps, ghost text, next edits) unless require("flywheel").setup()
-- ran first.
local flywheel = require("flywheel")
flywheel.init()
return flywheel.client_config(flywheel.options)
