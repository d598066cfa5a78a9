--- Flywheel suggestions in the buffer: what the user saw and did with each one, and next edits.
---
--- Inline completions (Neovim's native ghost text) report their lifetime to the server:
---   shown               the ghost text is on screen (flywheel/completionShown)
---   accepted            the item's command ran (the server records it; nothing to send)
---   partially accepted  the user kept a proper prefix of it: accept-word / accept-line keymaps,
---                       or typed the same characters (flywheel/completionPartiallyAccepted with
---                       the characters kept), reported when its lifetime ends
---   rejected            its lifetime ended with nothing kept: a new suggestion replaced it, the
---                       user typed something else or left insert mode (flywheel/completionRejected)
---
--- Next edits (flywheel/nextEdit) are asked for after an accepted completion and after an edit
--- pause. One is drawn as a diff at its location (the old text struck through, the new lines as
--- virtual lines) and reported shown; Tab jumps to it, Tab again applies it (only at the
--- document version it was made for) and runs its command, Esc dismisses it (rejected). An edit
--- that moves the document on discards it (rejected: typed over). An answer for a version that
--- has moved on is never drawn. While a next edit is drawn, or asked for after an accept, ghost
--- text is held back, so that Tab has one meaning; an edit pause with ghost text on screen does
--- not ask.
---
--- Where the cursor rests ('updatetime' without a key: CursorHold, CursorHoldI) the server is told
--- (flywheel/cursorIdle) and prefills the prompt a completion there would send, so that the first
--- keystroke finds it computed.
---
--- The VS Code client (lsp/clients/vscode/src) follows the same contract.

local S = {}

S.ns = vim.api.nvim_create_namespace("flywheel.next_edit")
local ghost_ns = vim.api.nvim_create_namespace("nvim.lsp.inline_completion") -- Neovim's own

S.options = { enabled = true, debounce_ms = 800 }
S.state = {
  inline = nil, -- the shown ghost text: {sid, bufnr, row, col, text, typed, outcome}
  next_edit = nil, -- the drawn next edit: the server's answer plus bufnr and byte positions
  last_sid = nil, -- the latest suggestion shown (for :FlywheelRateSuggestion)
  pending = {}, -- bufnr -> {client, id} of the nextEdit request in flight
}

local timer = nil
local attached = {} -- bufnr -> true once nvim_buf_attach watches it

local function notify_server(c, method, params)
  if c and not c:is_stopped() then
    c:notify(method, params)
  end
end

local function version_of(bufnr)
  return vim.lsp.util.buf_versions[bufnr]
end

--- The byte column of an LSP position (UTF-16 character) in `bufnr`.
local function byte_col(bufnr, pos)
  local line = vim.api.nvim_buf_get_lines(bufnr, pos.line, pos.line + 1, false)[1] or ""
  return vim.str_byteindex(line, "utf-16", math.min(pos.character, vim.str_utfindex(line, "utf-16")), false)
end

-- Inline completion feedback -------------------------------------------------------------------

local function sid_of(item)
  local cmd = item and item.command
  local arg = cmd and cmd.arguments and cmd.arguments[1]
  return type(arg) == "string" and arg or nil
end

--- Characters of the shown text the user kept: what lies between its anchor and the cursor,
--- when that is a prefix of the text (nil when the user wrote something else).
local function kept(inline)
  if not vim.api.nvim_buf_is_valid(inline.bufnr) then
    return nil
  end
  local win = vim.fn.bufwinid(inline.bufnr)
  if win == -1 then
    return nil
  end
  local cur = vim.api.nvim_win_get_cursor(win)
  local row, col = cur[1] - 1, cur[2]
  if row < inline.row or (row == inline.row and col < inline.col) then
    return nil
  end
  local typed = table.concat(vim.api.nvim_buf_get_text(inline.bufnr, inline.row, inline.col, row, col, {}), "\n")
  return inline.text:sub(1, #typed) == typed and typed or nil
end

--- The shown ghost text's lifetime ends: report partial acceptance or rejection (not both).
--- `live`: measure what was kept now (in insert mode); else use what the last change left
--- (leaving insert mode moves the cursor back by one).
function S.end_inline(c, live)
  local inline = S.state.inline
  S.state.inline = nil
  if not inline or inline.outcome then
    return
  end
  local typed = live and kept(inline) or inline.typed
  if typed and #typed > 0 then
    notify_server(c, "flywheel/completionPartiallyAccepted",
      { suggestionId = inline.sid, acceptedChars = vim.str_utfindex(typed, "utf-16") })
  else
    notify_server(c, "flywheel/completionRejected", { suggestionId = inline.sid })
  end
end

--- After Neovim handled an inline-completion answer: the ghost text on screen, if any, is shown.
local function after_inline_answer(c, bufnr, params, result)
  local items = result and (result.items or result) or {}
  local item = items[1]
  local sid = sid_of(item)
  local on_screen = #vim.api.nvim_buf_get_extmarks(bufnr, ghost_ns, 0, -1, { limit = 1 }) > 0
  if S.state.inline and S.state.inline.sid ~= sid then
    S.end_inline(c, true)
  end
  if sid and on_screen and not S.state.inline then
    local text = type(item.insertText) == "string" and item.insertText or (item.insertText or {}).value or ""
    local pos = (item.range and item.range.start) or params.position
    S.state.inline = { sid = sid, bufnr = bufnr, row = pos.line, col = byte_col(bufnr, pos), text = text }
    S.state.last_sid = sid
    notify_server(c, "flywheel/completionShown", { suggestionId = sid })
  end
end

--- The next word of `rest`, as VS Code's accept-word takes it: blanks, then any punctuation, then
--- a word ("(a, b)" gives "(a", "foo.bar()" gives "foo"); punctuation alone when no word
--- follows on the line.
function S.next_word(rest)
  return rest:match("^%s*[^%w_%s]*[%w_]+") or rest:match("^%s*[^%w_%s]+") or rest:match("^%s+") or rest
end

--- Accept the next word or line of the ghost text (a partial acceptance).
function S.accept_part(unit)
  local inline = S.state.inline
  return vim.lsp.inline_completion.get({
    on_accept = function()
      if not inline then
        return
      end
      local rest = inline.text:sub(#(kept(inline) or "") + 1)
      local part = unit == "line" and (rest:match("^\n?[^\n]*") or rest) or S.next_word(rest)
      if part ~= "" then
        vim.api.nvim_paste(part, false, -1)
      end
    end,
  })
end

-- Next edit ------------------------------------------------------------------------------------

local function clear_drawing(bufnr)
  if vim.api.nvim_buf_is_valid(bufnr) then
    vim.api.nvim_buf_clear_namespace(bufnr, S.ns, 0, -1)
  end
end

--- Forget the drawn next edit; `event` ("rejected") is reported for it.
function S.discard(event)
  local e = S.state.next_edit
  S.state.next_edit = nil
  if not e then
    return
  end
  clear_drawing(e.bufnr)
  if event then
    notify_server(e.client, "flywheel/completionRejected", { suggestionId = e.suggestionId })
  end
end

local function draw(e, keys)
  local srow, erow = e.range.start.line, e.range["end"].line
  local last = vim.api.nvim_buf_line_count(e.bufnr)
  local old_end_row, old_end_col = erow, e.ecol
  if old_end_row >= last then -- the range ends past the last line (a whole-line range at EOF)
    old_end_row, old_end_col = last - 1, #(vim.api.nvim_buf_get_lines(e.bufnr, last - 1, last, false)[1] or "")
  end
  if old_end_row > srow or old_end_col > e.scol then
    vim.api.nvim_buf_set_extmark(e.bufnr, S.ns, srow, e.scol, {
      end_row = old_end_row, end_col = old_end_col, hl_group = "FlywheelNextEditDelete", priority = 210,
    })
  end
  local virt = {}
  for _, s in ipairs(vim.split(e.newText:gsub("\n$", ""), "\n", { plain = true })) do
    table.insert(virt, { { "+ " .. s, "DiffAdd" } })
  end
  table.insert(virt, { { ("  [Flywheel next edit: %s to jump, again to accept; %s to dismiss]"):format(keys.accept or ":FlywheelNextEditAccept", keys.dismiss or ":FlywheelNextEditDismiss"), "Comment" } })
  local anchor = math.min(math.max(erow - ((e.ecol == 0 and erow > srow) and 1 or 0), srow), last - 1)
  vim.api.nvim_buf_set_extmark(e.bufnr, S.ns, anchor, 0, { virt_lines = virt, priority = 210 })
end

--- The cursor rests in `bufnr`: the server warms the place (see the header).
function S.cursor_idle(c, bufnr)
  local win = vim.fn.bufwinid(bufnr)
  if win == -1 or not vim.api.nvim_buf_is_valid(bufnr) then
    return
  end
  notify_server(c, "flywheel/cursorIdle", {
    textDocument = { uri = vim.uri_from_bufnr(bufnr), version = version_of(bufnr) },
    position = vim.lsp.util.make_position_params(win, "utf-16").position,
  })
end

--- Ask the server for the next edit in `bufnr` (the previous request still in flight is
--- cancelled). `after_accept`: asked right after an accepted suggestion; ghost text waits for it.
function S.request(bufnr, keys, after_accept)
  bufnr = (bufnr == nil or bufnr == 0) and vim.api.nvim_get_current_buf() or bufnr
  local c = vim.lsp.get_clients({ bufnr = bufnr, name = "flywheel" })[1]
  if not (c and S.options.enabled) or S.state.next_edit then
    return
  end
  local inflight = S.state.pending[bufnr]
  if inflight then
    pcall(inflight.client.cancel_request, inflight.client, inflight.id)
  end
  local version = version_of(bufnr)
  local win = vim.fn.bufwinid(bufnr)
  local params = { textDocument = { uri = vim.uri_from_bufnr(bufnr), version = version } }
  if win ~= -1 then
    params.position = vim.lsp.util.make_position_params(win, "utf-16").position
  end
  local ok, id = c:request("flywheel/nextEdit", params, function(err, result)
    S.state.pending[bufnr] = nil
    if err or type(result) ~= "table" or not vim.api.nvim_buf_is_valid(bufnr) then
      return -- ContentModified: the text moved on while the model ran; the next pause asks again
    end
    if result.version ~= version_of(bufnr) or S.state.next_edit then
      return -- never drawn on text it was not made for
    end
    local e = vim.tbl_extend("force", result, { bufnr = bufnr, client = c })
    e.scol, e.ecol = byte_col(bufnr, result.range.start), byte_col(bufnr, result.range["end"])
    S.state.next_edit = e
    S.state.last_sid = e.suggestionId
    draw(e, keys or {})
    notify_server(c, "flywheel/completionShown", { suggestionId = e.suggestionId })
  end, bufnr)
  if ok then
    S.state.pending[bufnr] = { client = c, id = id, after_accept = after_accept }
  end
end

--- A next edit is drawn in `bufnr`, or asked for after an accept: ghost text is held back.
function S.holding(bufnr)
  local e = S.state.next_edit
  local p = S.state.pending[bufnr]
  return (e ~= nil and e.bufnr == bufnr) or (p ~= nil and p.after_accept == true)
end

--- The next edit drawn in the current buffer, if any.
local function here()
  local e = S.state.next_edit
  return e and e.bufnr == vim.api.nvim_get_current_buf() and e or nil
end

--- Tab: jump to the next edit, or apply it when the cursor is on it. False: there is none here.
function S.tab()
  local e = here()
  if not e then
    return false
  end
  vim.schedule(function()
    if S.state.next_edit ~= e then
      return
    end
    local row = vim.api.nvim_win_get_cursor(0)[1] - 1
    local srow, erow = e.range.start.line, math.max(e.range["end"].line - (e.ecol == 0 and 1 or 0), e.range.start.line)
    if row < srow or row > erow then
      local last = vim.api.nvim_buf_line_count(e.bufnr)
      vim.api.nvim_win_set_cursor(0, { math.min(srow + 1, last), e.scol })
      return
    end
    S.state.next_edit = nil -- before the edit, so that it is not taken for typing over it
    clear_drawing(e.bufnr)
    if version_of(e.bufnr) ~= e.version then
      return vim.notify("Flywheel: the text changed; the next edit was not applied", vim.log.levels.WARN)
    end
    vim.lsp.util.apply_text_edits({ { range = e.range, newText = e.newText } }, e.bufnr, "utf-16")
    e.client:exec_cmd(e.command, { bufnr = e.bufnr })
  end)
  return true
end

--- Esc: dismiss the next edit (rejected). False: there is none here.
function S.dismiss()
  if not here() then
    return false
  end
  S.discard("rejected")
  return true
end

-- Wiring ---------------------------------------------------------------------------------------

local function on_text_changed(args, keys)
  local inline = S.state.inline
  if inline and inline.bufnr == args.buf then
    inline.typed = kept(inline)
  end
  if timer then
    timer:stop()
  end
  if S.options.enabled then
    timer = vim.defer_fn(function()
      timer = nil
      local ghost = S.state.inline ~= nil and S.state.inline.bufnr == args.buf
      if vim.api.nvim_buf_is_valid(args.buf) and args.buf == vim.api.nvim_get_current_buf() and not ghost then
        S.request(args.buf, keys) -- an edit pause; not while ghost text is on screen
      end
    end, S.options.debounce_ms)
  end
end

--- Wrap the flywheel client: see inline-completion answers, and accepted completions.
function S.attach(c, bufnr, keys)
  if not c.flywheel_wrapped then
    c.flywheel_wrapped = true
    local request, exec_cmd = c.request, c.exec_cmd
    c.request = function(self, method, params, handler, b)
      if method == "textDocument/inlineCompletion" and handler then
        local inner = handler
        handler = function(err, result, ctx, ...)
          if ctx and S.holding(ctx.bufnr) then
            result = { items = {} } -- a next edit came first: Tab has one meaning
          end
          inner(err, result, ctx, ...)
          if not err and ctx and vim.api.nvim_buf_is_valid(ctx.bufnr or 0) then
            after_inline_answer(self, ctx.bufnr, params, result)
          end
        end
      end
      return request(self, method, params, handler, b)
    end
    c.exec_cmd = function(self, command, context, handler)
      local accepted = command and command.command == "flywheel.acceptCompletion"
      local sid = accepted and command.arguments and command.arguments[1]
      if accepted and S.state.inline and S.state.inline.sid == sid then
        S.state.inline.outcome = "accepted"
        S.state.inline = nil
      end
      local result = exec_cmd(self, command, context, handler)
      local b = context and context.bufnr or vim.api.nvim_get_current_buf()
      if accepted and (not S.state.next_edit or S.state.next_edit.suggestionId ~= sid) then
        vim.schedule(function() S.request(b, keys, true) end) -- right after an accepted completion
      end
      return result
    end
  end
  if not attached[bufnr] then
    attached[bufnr] = true
    vim.api.nvim_buf_attach(bufnr, false, {
      on_lines = function() -- any change: a drawn next edit is for text that is gone (typed over)
        local e = S.state.next_edit
        if e and e.bufnr == bufnr then
          vim.schedule(function() -- (no extmark changes inside on_lines)
            if S.state.next_edit == e then
              S.discard("rejected")
            end
          end)
        end
      end,
      on_detach = function() attached[bufnr] = nil end,
    })
  end
  local group = vim.api.nvim_create_augroup("flywheel.suggestions." .. bufnr, { clear = true })
  vim.api.nvim_create_autocmd({ "TextChanged", "TextChangedI" }, {
    group = group, buffer = bufnr, callback = function(args) on_text_changed(args, keys) end,
  })
  vim.api.nvim_create_autocmd({ "InsertLeave", "BufLeave" }, {
    group = group, buffer = bufnr, callback = function() S.end_inline(c, false) end,
  })
  vim.api.nvim_create_autocmd({ "CursorHold", "CursorHoldI" }, {
    group = group, buffer = bufnr, callback = function() S.cursor_idle(c, bufnr) end,
  })
end

vim.api.nvim_set_hl(0, "FlywheelNextEditDelete",
  { strikethrough = true, fg = "#c05050", ctermfg = 1, cterm = { strikethrough = true }, default = true })

return S
