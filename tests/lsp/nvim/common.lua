-- Shared by the headless Neovim tests: read the config the Python test wrote, collect results,
-- write them as JSON and quit, whatever happens. Run as: nvim --headless --clean -S SCRIPT.lua
vim.g.loaded_python3_provider = 0
local T = {}
T.cfg = vim.json.decode(table.concat(vim.fn.readfile(os.getenv("FLYWHEEL_TEST_CONFIG")), "\n"))
vim.opt.rtp:prepend(T.cfg.plugin)
T.results = { log = {} }

function T.log(msg)
  table.insert(T.results.log, msg)
end

function T.wait(what, ms, cond)
  if not vim.wait(ms, cond, 20) then
    error("timed out waiting for " .. what)
  end
end

function T.client()
  return vim.lsp.get_clients({ name = "flywheel" })[1]
end

function T.request(method, params)
  local answer = T.client():request_sync(method, params or vim.empty_dict(), 30000)
  assert(answer and not answer.err, method .. " failed: " .. vim.inspect(answer))
  return answer.result
end

--- Run `body` in a coroutine from the main loop, so it can give control back to Neovim (a mode
--- change such as insert mode only happens in the main loop); then write the results and quit.
function T.run(body)
  T.co = coroutine.create(function()
    local ok, err = xpcall(body, debug.traceback)
    T.results.ok = ok
    T.results.error = not ok and tostring(err) or nil
    pcall(T.request, "flywheel/debug/flush")
    vim.fn.writefile({ vim.json.encode(T.results) }, T.cfg.out)
    vim.cmd("qall!")
  end)
  vim.schedule(function()
    assert(coroutine.resume(T.co))
  end)
end

--- Enter insert mode at the end of the cursor's line (returns once Neovim is in insert mode).
function T.insert()
  vim.api.nvim_create_autocmd("InsertEnter", {
    once = true,
    callback = function()
      vim.schedule(function()
        assert(coroutine.resume(T.co))
      end)
    end,
  })
  vim.cmd("startinsert!")
  coroutine.yield()
end

function T.start()
  require("flywheel").setup({ cmd = T.cfg.cmd, root_dir = T.cfg.root, settings = T.cfg.settings })
  vim.cmd.edit(T.cfg.file)
  T.wait("the server to attach", 120000, function()
    local c = T.client()
    return c ~= nil and c.initialized and #vim.lsp.get_clients({ bufnr = 0, name = "flywheel" }) > 0
  end)
end

return T
