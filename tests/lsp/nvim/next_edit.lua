-- One scripted editor session (the VS Code tier plays the same one): ghost text accepted, the
-- next edit it brings jumped to and applied with Tab, ghost text partly accepted (a word), and
-- ghost text dismissed with Esc.
local T = dofile(vim.fn.fnamemodify(debug.getinfo(1, "S").source:sub(2), ":h") .. "/common.lua")

--- Keys as the user types them: queued, then handled by the main loop (mappings apply).
local function keys(k)
  vim.api.nvim_feedkeys(vim.api.nvim_replace_termcodes(k, true, false, true), "m", false)
  vim.defer_fn(function() assert(coroutine.resume(T.co)) end, 100)
  coroutine.yield()
end

--- Leave insert mode (it ends in the main loop, so give control back to it).
local function normal()
  vim.cmd("stopinsert")
  vim.defer_fn(function() assert(coroutine.resume(T.co)) end, 50)
  coroutine.yield()
end

local function lines()
  return vim.api.nvim_buf_get_lines(0, 0, -1, false)
end

local function ghost()
  local ns = vim.api.nvim_create_namespace("nvim.lsp.inline_completion")
  T.wait("ghost text", 120000, function()
    return #vim.api.nvim_buf_get_extmarks(0, ns, 0, -1, {}) > 0
      and require("flywheel.suggestions").state.inline ~= nil
  end)
end

T.run(function()
  T.start()
  local S = require("flywheel.suggestions")
  local last = vim.api.nvim_buf_line_count(0)

  -- 1. ghost text at the end of the last line, accepted
  vim.api.nvim_win_set_cursor(0, { last, 0 })
  T.insert()
  ghost()
  local before = lines()
  assert(vim.lsp.inline_completion.get(), "no ghost text to accept")
  T.wait("the accepted text", 120000, function() return not vim.deep_equal(lines(), before) end)
  T.results.after_ghost = lines()
  normal()

  -- 2. the next edit it brings: drawn away from the cursor, Tab jumps to it, Tab applies it
  T.wait("a next edit", 120000, function() return S.state.next_edit ~= nil end)
  T.results.next_edit = { range = S.state.next_edit.range, newText = S.state.next_edit.newText }
  T.results.next_edit_marks = #vim.api.nvim_buf_get_extmarks(0, S.ns, 0, -1, {})
  T.results.virt_lines = {}
  for _, m in ipairs(vim.api.nvim_buf_get_extmarks(0, S.ns, 0, -1, { details = true })) do
    for _, vl in ipairs(m[4].virt_lines or {}) do
      table.insert(T.results.virt_lines, vl[1][1])
    end
  end
  T.results.cursor_before_jump = vim.api.nvim_win_get_cursor(0)[1]
  keys("<Tab>")
  T.wait("the jump", 120000, function() return vim.api.nvim_win_get_cursor(0)[1] ~= T.results.cursor_before_jump end)
  T.results.cursor_after_jump = vim.api.nvim_win_get_cursor(0)[1]
  local jumped = lines()
  keys("<Tab>")
  T.wait("the applied next edit", 120000, function() return not vim.deep_equal(lines(), jumped) end)
  T.results.after_next_edit = lines()
  T.results.marks_after = #vim.api.nvim_buf_get_extmarks(0, S.ns, 0, -1, {})

  -- 3. ghost text on a new function body, its first word accepted (a partial acceptance)
  vim.api.nvim_buf_set_lines(0, -1, -1, false, { "", "", "def sub(a, b):", "    " })
  vim.api.nvim_win_set_cursor(0, { vim.api.nvim_buf_line_count(0), 4 })
  T.insert()
  ghost()
  local partial = S.state.inline.sid
  local typed = lines()
  keys("<M-l>")
  T.wait("the accepted word", 120000, function() return not vim.deep_equal(lines(), typed) end)
  T.results.after_word = lines()
  normal()
  T.wait("the end of the partly accepted ghost text", 120000, function()
    return S.state.inline == nil or S.state.inline.sid ~= partial
  end)

  -- 4. ghost text dismissed with Esc
  vim.api.nvim_buf_set_lines(0, -1, -1, false, { "", "", "def div(a, b):", "    " })
  vim.api.nvim_win_set_cursor(0, { vim.api.nvim_buf_line_count(0), 4 })
  T.insert()
  ghost()
  keys("<Esc>")
  T.wait("normal mode", 120000, function() return vim.api.nvim_get_mode().mode == "n" end)
  T.results.final = lines()

  -- 5. control: rate the last suggestion, toggle ghost text, change the consent
  vim.cmd("FlywheelRateSuggestion -1")
  vim.cmd("FlywheelToggleCompletion")
  T.results.inline_after_toggle = vim.lsp.inline_completion.is_enabled({ bufnr = 0 })
  vim.cmd("FlywheelToggleCompletion")
  T.results.inline_after_second_toggle = vim.lsp.inline_completion.is_enabled({ bufnr = 0 })
  vim.cmd("FlywheelConsent metrics")
  T.request("workspace/executeCommand", { command = "flywheel.status", arguments = {} })
end)
