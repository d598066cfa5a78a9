-- Driven by benchmarks/nvim_ghost_latency.py: Neovim 0.12 with the Flywheel plugin and the real
-- `flywheel lsp`. For each trial line: empty it to `return `, enter insert mode at its end, type
-- one character as the user would (nvim_feedkeys, typed), and time until Neovim draws the ghost
-- text (an extmark in its inline-completion namespace), or until the server answered a request
-- made after the keystroke and nothing was drawn (the model declined the place); then put the
-- line back. Writes {trials: [{line, ms, ghost, typed_line, answered}], ...} as JSON and quits.
vim.g.loaded_python3_provider = 0
local cfg = vim.json.decode(table.concat(vim.fn.readfile(os.getenv("FLYWHEEL_BENCH_CONFIG")), "\n"))
vim.opt.rtp:prepend(cfg.plugin)
local ns = vim.api.nvim_create_namespace("nvim.lsp.inline_completion")
local out = { trials = {} }
local co
local GRACE_NS = 300 * 1e6 -- after an answer, time for its ghost text to be drawn

-- Inline-completion requests sent since the keystroke (a cancelled one is dropped), and when the
-- first of them was answered.
local asked, answered = {}, nil
vim.api.nvim_create_autocmd("LspRequest", {
  callback = function(ev)
    local id, request = ev.data.request_id, ev.data.request
    if request.method ~= "textDocument/inlineCompletion" then
      return
    end
    if request.type == "pending" then
      asked[id] = true
    elseif request.type == "cancel" then
      asked[id] = nil
    elseif request.type == "complete" and asked[id] then
      answered = answered or vim.uv.hrtime()
    end
  end,
})

local function resume()
  vim.schedule(function() assert(coroutine.resume(co)) end)
end

local function ghost_marks()
  return vim.api.nvim_buf_get_extmarks(0, ns, 0, -1, { details = true })
end

co = coroutine.create(function()
  local ok, err = xpcall(function()
    require("flywheel").setup({ cmd = cfg.cmd, root_dir = cfg.root, settings = cfg.settings })
    vim.cmd.edit(cfg.file)
    assert(vim.wait(600000, function()
      local c = vim.lsp.get_clients({ name = "flywheel" })[1]
      return c ~= nil and c.initialized and require("flywheel").state.status.state == "idle"
    end, 50), "the server did not become ready: " .. require("flywheel").statusline())
    for i, line in ipairs(cfg.lines) do
      vim.api.nvim_buf_set_lines(0, line - 1, line, true, { "    return " })
      vim.api.nvim_win_set_cursor(0, { line, 0 })
      vim.api.nvim_create_autocmd("InsertEnter", { once = true, callback = resume })
      vim.cmd("startinsert!")
      coroutine.yield()
      assert(vim.wait(10000, function() return #ghost_marks() == 0 end, 5), "old ghost text stayed")
      -- typeahead is only read by the main loop (not inside vim.wait): yield to it, and go on
      -- once the typed character is in the buffer
      vim.api.nvim_create_autocmd("TextChangedI", { once = true, callback = resume })
      asked, answered = {}, nil
      local t0 = vim.uv.hrtime()
      vim.api.nvim_feedkeys(cfg.typed, "t", false)
      coroutine.yield()
      vim.wait(cfg.timeout_ms, function()
        return #ghost_marks() > 0 or (answered ~= nil and vim.uv.hrtime() - answered > GRACE_NS)
      end, 1)
      local shown = #ghost_marks() > 0
      local ms = (vim.uv.hrtime() - t0) / 1e6
      local text = ""
      if shown then
        for _, chunk in ipairs(ghost_marks()[1][4].virt_text or {}) do
          text = text .. chunk[1]
        end
      end
      table.insert(out.trials, {
        line = line,
        ms = shown and ms or vim.NIL,
        ghost = text,
        typed_line = vim.api.nvim_get_current_line(),
        answered = answered ~= nil,
      })
      vim.api.nvim_create_autocmd("InsertLeave", { once = true, callback = resume })
      vim.api.nvim_feedkeys(vim.api.nvim_replace_termcodes("<Esc>", true, false, true), "t", false)
      coroutine.yield()
      vim.api.nvim_buf_set_lines(0, line - 1, line, true, { cfg.finished[i] })
    end
    local c = vim.lsp.get_clients({ name = "flywheel" })[1]
    c:request_sync("flywheel/debug/flush", vim.empty_dict(), 30000)
  end, debug.traceback)
  out.ok, out.error = ok, not ok and tostring(err) or nil
  vim.fn.writefile({ vim.json.encode(out) }, cfg.out)
  vim.cmd("qall!")
end)
resume()
