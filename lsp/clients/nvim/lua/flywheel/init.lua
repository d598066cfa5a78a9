--- Flywheel for Neovim: a thin client of `flywheel lsp`.
---
---   require("flywheel").setup({})             -- defaults below; needs Neovim 0.11+ (0.12 for ghost text)
---
--- or, with the defaults, as `flywheel lsp --setup` prints it (lsp/flywheel.lua is the config):
---
---   vim.opt.runtimepath:append("<checkout>/lsp/clients/nvim")
---   vim.lsp.config("flywheel", { cmd = { "<checkout>/.venv/bin/flywheel", "lsp" } })
---   vim.lsp.enable("flywheel")
---
--- What it does: starts the server with vim.lsp.config/vim.lsp.enable, turns on Neovim's native
--- inline completion (0.12: vim.lsp.inline_completion; its items carry a command that reports
--- acceptance), adds commands and keymaps for agent tasks and the review of their proposals, shows
--- each task step as it happens (a scratch buffer, `:FlywheelSteps`) and previews pending hunks in
--- the buffer (removed lines highlighted, new lines as virtual lines).
---
--- Nothing it says blocks: every message is one line that fits the command line (so Neovim never
--- asks to "Press ENTER"); whole texts (task steps, answers) go to the steps buffer. The status
--- reads "starting" until the server's first flywheel/status, shows the model's first-run
--- preparation (the server's work-done progress) with its percentage, and every change redraws
--- the statusline and fires `User FlywheelStatus` for statusline plugins.
---
--- What it does not do: compute anything. Every decision (prompts, hunks, staleness, telemetry)
--- is the server's; this file renders and sends commands.
---
--- Suggestions (suggestions.lua): each ghost text's lifetime is reported (shown, accepted,
--- partially accepted, rejected), and next edits are asked for, drawn, jumped to and applied.
---
--- Commands: :FlywheelAsk [question] (with a range: about the selection), :FlywheelFix (the
--- diagnostic under the cursor), :FlywheelAcceptHunk, :FlywheelRejectHunk, :FlywheelNextHunk,
--- :FlywheelPrevHunk, :FlywheelAcceptAll, :FlywheelRejectAll, :FlywheelRate {1|0|-1} [comment],
--- :FlywheelRateSuggestion {1|0|-1}, :FlywheelCancel, :FlywheelSteps, :FlywheelStatus,
--- :FlywheelNextEdit, :FlywheelToggleCompletion, :FlywheelConsent [off|metrics|code],
--- :FlywheelRestart.

local M = {}
local suggestions = require("flywheel.suggestions")

M.defaults = {
  cmd = { "flywheel", "lsp" }, -- how to start the server
  filetypes = nil, -- nil: every filetype
  root_markers = { ".git", "pyproject.toml", "package.json", "go.mod", "Cargo.toml" },
  root_dir = nil, -- a folder or a function(bufnr, on_dir) as in vim.lsp.config; overrides root_markers
  settings = {}, -- the server's settings (lsp/settings.py), sent as initializationOptions
  inline_completion = true, -- enable native ghost text where Neovim has it (0.12)
  next_edit = { enabled = true, debounce_ms = 800 }, -- ask after an accept and after this pause
  keymaps = {
    accept_completion = "<C-l>", -- insert mode: accept the ghost text
    accept_word = "<M-l>", -- insert mode: accept the ghost text's next word
    accept_line = "<M-j>", -- insert mode: accept the rest of the ghost text's line
    next_edit_accept = "<Tab>", -- jump to the next edit, then apply it (falls through when none)
    next_edit_dismiss = "<Esc>", -- dismiss the next edit (falls through when none)
    ask = "<leader>fa", -- normal: ask; visual: ask about the selection
    accept_hunk = "<leader>fy",
    reject_hunk = "<leader>fn",
    next_hunk = "]f",
    prev_hunk = "[f",
    rate_up = "<leader>f+",
    rate_down = "<leader>f-",
  },
}

M.ns = vim.api.nvim_create_namespace("flywheel.proposals")

--- What the plugin knows; tests and statuslines read it.
M.state = {
  status = { state = "starting", modelVersion = "" }, -- until the server's first flywheel/status
  progress = nil, -- the model's preparation on a first start: { percentage, message }
  steps = {}, -- every flywheel/taskStep, in order
  tasks = {}, -- taskId -> the executeCommand result once finished (status, answer, proposals)
  proposals = {}, -- proposalId -> proposal (hunks with their state, updated as the user reviews)
  last_task = nil, -- the most recent task id (for :FlywheelRate)
  running = nil, -- the running task id
}

local function client(bufnr)
  return vim.lsp.get_clients({ bufnr = bufnr or 0, name = "flywheel" })[1]
    or vim.lsp.get_clients({ name = "flywheel" })[1]
end

--- `text` as one line that fits the command line: more would make Neovim ask to "Press ENTER".
local function one_line(text)
  local line = text:gsub("%s*\n%s*", " | ")
  local room = math.max(vim.v.echospace - 1, 20)
  if vim.fn.strdisplaywidth(line) > room then
    line = vim.fn.strcharpart(line, 0, room - 1) .. "…"
  end
  return line
end
M.one_line = one_line

local function notify(msg, level)
  vim.notify(one_line("Flywheel: " .. msg), level or vim.log.levels.INFO)
end

local progress_id -- the message that shows the model's preparation (updated in place)

--- The model's preparation as one message line that updates in place (a Neovim 0.12 progress
--- message, with its percentage; an older Neovim gets a plain one-line echo), so a first start
--- shows what it is doing without a statusline set up, and never asks to "Press ENTER".
local function show_progress(value)
  local p = M.state.progress or {}
  local done = value.kind == "end"
  -- a progress message is drawn as "Flywheel: NN% TEXT": the text is the step alone
  local step = done and (value.message or "the model is ready") or ("preparing the model: " .. (p.message or ""))
  local ok, id = pcall(vim.api.nvim_echo, { { one_line(step) } }, done, {
    id = progress_id,
    kind = "progress",
    title = "Flywheel",
    status = done and "success" or "running",
    percent = p.percentage,
  })
  if not ok then -- no progress messages in this Neovim
    local plain = done and ("Flywheel: " .. step) or ("Flywheel: %d%% %s"):format(p.percentage or 0, step)
    vim.api.nvim_echo({ { one_line(plain) } }, done, {})
  end
  progress_id = (ok and not done) and id or nil
end

--- A status change: the statusline redraws now, and statusline plugins hear of it.
local function status_changed()
  vim.cmd("redrawstatus!")
  vim.api.nvim_exec_autocmds("User", { pattern = "FlywheelStatus", modeline = false })
end

local function execute(command, arguments, on_result)
  local c = client()
  if not c then
    notify("the server is not running here (is `flywheel` on PATH?)", vim.log.levels.ERROR)
    return
  end
  c:request("workspace/executeCommand", { command = command, arguments = arguments }, function(err, result)
    if err then
      notify(err.message or vim.inspect(err), vim.log.levels.ERROR)
    end
    if on_result then
      on_result(err, result)
    end
  end)
end

-- Steps --------------------------------------------------------------------------------------

local steps_buf

local function steps_buffer()
  if not (steps_buf and vim.api.nvim_buf_is_valid(steps_buf)) then
    steps_buf = vim.api.nvim_create_buf(false, true)
    vim.api.nvim_buf_set_name(steps_buf, "flywheel://steps")
    vim.bo[steps_buf].filetype = "markdown"
  end
  return steps_buf
end

local function on_step(_, params)
  table.insert(M.state.steps, params)
  M.state.running = params.kind ~= "stop" and params.taskId or nil
  local head = ("## %s step %d (%s)"):format(params.role, params.index, params.kind or "")
  local lines = { head }
  vim.list_extend(lines, vim.split(params.text or "", "\n", { plain = true }))
  for _, call in ipairs(params.calls or {}) do
    table.insert(lines, ("-> %s %s"):format(call.name, vim.json.encode(call.arguments or vim.empty_dict())))
  end
  local buf = steps_buffer()
  vim.api.nvim_buf_set_lines(buf, -1, -1, false, lines)
  vim.api.nvim_echo({ { one_line(("Flywheel: %s %s"):format(params.role, params.text or "")) } }, false, {})
end

-- Proposals and their preview -------------------------------------------------------------------

local function line_count(text)
  local _, n = text:gsub("\n", "")
  return n
end

local function buffer_of(uri)
  local bufnr = vim.uri_to_bufnr(uri)
  return vim.api.nvim_buf_is_loaded(bufnr) and bufnr or nil
end

--- Draw every pending hunk of every proposal in its buffer.
function M.render()
  for _, bufnr in ipairs(vim.api.nvim_list_bufs()) do
    vim.api.nvim_buf_clear_namespace(bufnr, M.ns, 0, -1)
  end
  for _, p in pairs(M.state.proposals) do
    local bufnr = buffer_of(p.uri)
    if bufnr then
      local last = vim.api.nvim_buf_line_count(bufnr)
      for _, h in ipairs(p.hunks) do
        if h.state == "pending" then
          local first, stop = h.range.start.line, h.range["end"].line
          for l = first, math.min(stop, last) - 1 do
            vim.api.nvim_buf_set_extmark(bufnr, M.ns, l, 0, { line_hl_group = "DiffDelete", priority = 200 })
          end
          local virt = {}
          for _, s in ipairs(vim.split(h.newText:gsub("\n$", ""), "\n", { plain = true })) do
            if h.newText ~= "" then
              table.insert(virt, { { "+ " .. s, "DiffAdd" } })
            end
          end
          table.insert(virt, { { ("  [Flywheel hunk %d: accept %s / reject %s]"):format(h.index + 1,
            M.options.keymaps.accept_hunk or ":FlywheelAcceptHunk",
            M.options.keymaps.reject_hunk or ":FlywheelRejectHunk"), "Comment" } })
          local anchor = math.min(math.max(stop - 1, first), math.max(last - 1, 0))
          vim.api.nvim_buf_set_extmark(bufnr, M.ns, anchor, 0, { virt_lines = virt, priority = 200 })
        end
      end
    end
  end
end

local function on_proposal(_, params)
  M.state.proposals[params.proposalId] = params
  local bufnr = buffer_of(params.uri)
  if not bufnr then
    vim.fn.bufload(vim.uri_to_bufnr(params.uri))
  end
  M.render()
  notify(("%d hunk(s) proposed for %s; review with %s / %s"):format(#params.hunks,
    vim.fn.fnamemodify(vim.uri_to_fname(params.uri), ":t"), M.options.keymaps.next_hunk or ":FlywheelNextHunk",
    M.options.keymaps.accept_hunk or ":FlywheelAcceptHunk"))
end

--- The pending hunks of the current buffer: { {proposal, hunk}, ... } sorted by line.
local function pending_here()
  local uri = vim.uri_from_bufnr(0)
  local out = {}
  for _, p in pairs(M.state.proposals) do
    if p.uri == uri then
      for _, h in ipairs(p.hunks) do
        if h.state == "pending" then
          table.insert(out, { p, h })
        end
      end
    end
  end
  table.sort(out, function(a, b) return a[2].range.start.line < b[2].range.start.line end)
  return out
end

--- The hunk under (or else after) the cursor.
local function current_hunk()
  local line = vim.api.nvim_win_get_cursor(0)[1] - 1
  local hunks = pending_here()
  for _, ph in ipairs(hunks) do
    local r = ph[2].range
    if line >= r.start.line and (line < r["end"].line or line == r.start.line) then
      return ph
    end
  end
  for _, ph in ipairs(hunks) do
    if ph[2].range.start.line >= line then
      return ph
    end
  end
  return hunks[1]
end

function M.jump(direction)
  local line = vim.api.nvim_win_get_cursor(0)[1] - 1
  local hunks = pending_here()
  if #hunks == 0 then
    return notify("no pending hunks in this buffer")
  end
  local target = direction > 0 and hunks[1] or hunks[#hunks]
  for i = 1, #hunks do
    local ph = direction > 0 and hunks[i] or hunks[#hunks + 1 - i]
    local l = ph[2].range.start.line
    if (direction > 0 and l > line) or (direction < 0 and l < line) then
      target = ph
      break
    end
  end
  local last = vim.api.nvim_buf_line_count(0)
  vim.api.nvim_win_set_cursor(0, { math.min(target[2].range.start.line + 1, last), 0 })
end

--- A hunk was accepted: later hunks of its proposal move by the lines it added or removed.
local function shift_after(p, h)
  local delta = line_count(h.newText) - line_count(h.original)
  for _, other in ipairs(p.hunks) do
    if other ~= h and other.range.start.line > h.range.start.line then
      other.range.start.line = other.range.start.line + delta
      other.range["end"].line = other.range["end"].line + delta
    end
  end
end

function M.review(accept, all)
  local ph = current_hunk()
  if not ph then
    return notify("no pending hunk here")
  end
  local p, h = ph[1], ph[2]
  local command = (accept and "flywheel.accept" or "flywheel.reject") .. (all and "All" or "Hunk")
  local args = all and { p.proposalId } or { p.proposalId, h.index }
  execute(command, args, function(err)
    local targets = all and p.hunks or { h }
    for _, t in ipairs(targets) do
      if t.state == "pending" then
        if err then
          t.state = "failed"
        else
          t.state = accept and "accepted" or "rejected"
          if accept then shift_after(p, t) end
        end
      end
    end
    M.render()
    -- the edit and the preview's virtual lines went in one step; a terminal could keep rows of
    -- the old screen (seen under tmux): repaint it whole
    vim.cmd.redraw({ bang = true })
  end)
end

-- Tasks ---------------------------------------------------------------------------------------

local function on_task_done(err, result)
  M.state.running = nil
  if err or not result then
    return
  end
  M.state.tasks[result.taskId] = result
  M.state.last_task = result.taskId
  if (result.answer or "") ~= "" then -- the whole answer, where it can be read at leisure
    local answer = { ("## answer (%s)"):format(result.status) }
    vim.list_extend(answer, vim.split(result.answer, "\n", { plain = true }))
    vim.api.nvim_buf_set_lines(steps_buffer(), -1, -1, false, answer)
  end
  local n = #(result.proposals or {})
  notify(("%s%s: %s"):format(result.status, n > 0 and (" (%d proposal(s) to review)"):format(n) or "",
    result.answer or ""))
  for _, s in ipairs(result.skipped or {}) do
    notify(s, vim.log.levels.WARN)
  end
end

local function range_of_selection(opts)
  if not opts or opts.range == 0 then
    return nil
  end
  local last = vim.fn.getline(opts.line2)
  return {
    start = { line = opts.line1 - 1, character = 0 },
    ["end"] = { line = opts.line2 - 1, character = vim.str_utfindex(last, "utf-16") },
  }
end

function M.ask(question, opts)
  local args = { uri = vim.uri_from_bufnr(0), question = question, range = range_of_selection(opts) }
  if not args.range then
    local pos = vim.api.nvim_win_get_cursor(0)
    args.range = { start = { line = pos[1] - 1, character = 0 }, ["end"] = { line = pos[1] - 1, character = 0 } }
  end
  execute("flywheel.ask", { args }, on_task_done)
end

function M.fix()
  local line = vim.api.nvim_win_get_cursor(0)[1] - 1
  local diag = vim.diagnostic.get(0, { lnum = line })[1]
  if not diag then
    return notify("no diagnostic on this line")
  end
  local lsp_diag = diag.user_data and diag.user_data.lsp or {
    message = diag.message,
    severity = diag.severity,
    range = { start = { line = diag.lnum, character = diag.col }, ["end"] = { line = diag.end_lnum or diag.lnum, character = diag.end_col or diag.col } },
  }
  execute("flywheel.fixDiagnostic", { { uri = vim.uri_from_bufnr(0), diagnostic = lsp_diag } }, on_task_done)
end

function M.rate(rating, comment)
  if not M.state.last_task then
    return notify("no task to rate yet")
  end
  execute("flywheel.rate", { { taskId = M.state.last_task, rating = rating, comment = comment } })
end

function M.cancel()
  local running = M.state.running or (M.state.steps[#M.state.steps] or {}).taskId
  if running then
    execute("flywheel.cancelTask", { running })
  end
end

--- For a statusline: "Flywheel idle (model-version)", with the reason when in error or stopped.
function M.statusline()
  local s = M.state.status
  local p = M.state.progress
  if p then
    return ("Flywheel preparing the model %d%% %s"):format(p.percentage or 0, p.message or "")
  end
  local reason = (s.state == "error" or s.state == "stopped") and (s.message or "") ~= "" and (": " .. s.message) or ""
  local version = s.modelVersion or ""
  if (s.completionModelVersion or "") ~= "" then -- the registry's completion lane
    version = version .. ", completions " .. s.completionModelVersion
  end
  return ("Flywheel %s%s%s"):format(s.state or "?", version ~= "" and (" (" .. version .. ")") or "", reason)
end

--- The server's telemetry consent: shown without an argument, changed with one.
function M.consent(level)
  local c = client()
  if not c then
    return notify("the server is not running", vim.log.levels.ERROR)
  end
  local settings = vim.deepcopy((c.settings or {}).flywheel or {})
  local now = (settings.telemetry or {}).consent or "code (the default)"
  if not level or level == "" then
    return notify("telemetry consent: " .. now .. " (:FlywheelConsent off|metrics|code)")
  end
  if level ~= "off" and level ~= "metrics" and level ~= "code" then
    return notify("consent must be off, metrics or code", vim.log.levels.ERROR)
  end
  settings.telemetry = vim.tbl_extend("force", settings.telemetry or {}, { consent = level })
  c.settings = vim.tbl_extend("force", c.settings or {}, { flywheel = settings })
  c:notify("workspace/didChangeConfiguration", { settings = { flywheel = settings } })
  notify("telemetry consent: " .. level)
end

--- Rate the latest suggestion shown (ghost text or next edit).
function M.rate_suggestion(rating)
  local sid = suggestions.state.last_sid
  if not sid then
    return notify("no suggestion to rate yet")
  end
  execute("flywheel.rate", { { suggestionId = sid, rating = rating } })
end

--- Stop the server and start it again for the open buffers.
function M.restart()
  for _, c in ipairs(vim.lsp.get_clients({ name = "flywheel" })) do
    c:stop(true)
  end
  vim.lsp.enable("flywheel", false)
  vim.defer_fn(function()
    M.state.status = { state = "starting", modelVersion = "" }
    status_changed()
    vim.lsp.enable("flywheel")
  end, 200)
end

-- Setup ---------------------------------------------------------------------------------------

local function commands()
  local cmd = vim.api.nvim_create_user_command
  cmd("FlywheelAsk", function(o) M.ask(o.args ~= "" and o.args or vim.fn.input("Ask Flywheel: "), o) end, { nargs = "*", range = true })
  cmd("FlywheelFix", M.fix, {})
  cmd("FlywheelAcceptHunk", function() M.review(true, false) end, {})
  cmd("FlywheelRejectHunk", function() M.review(false, false) end, {})
  cmd("FlywheelAcceptAll", function() M.review(true, true) end, {})
  cmd("FlywheelRejectAll", function() M.review(false, true) end, {})
  cmd("FlywheelNextHunk", function() M.jump(1) end, {})
  cmd("FlywheelPrevHunk", function() M.jump(-1) end, {})
  cmd("FlywheelRate", function(o)
    local rating = tonumber(o.fargs[1])
    if rating ~= 1 and rating ~= 0 and rating ~= -1 then
      return notify("usage: :FlywheelRate 1|0|-1 [comment]", vim.log.levels.ERROR)
    end
    local comment = table.concat(vim.list_slice(o.fargs, 2), " ")
    M.rate(rating, comment ~= "" and comment or nil)
  end, { nargs = "+" })
  cmd("FlywheelCancel", M.cancel, {})
  cmd("FlywheelSteps", function() vim.cmd("botright split | buffer " .. steps_buffer()) end, {})
  cmd("FlywheelStatus", function() notify(M.statusline()) end, {})
  cmd("FlywheelRateSuggestion", function(o)
    local rating = tonumber(o.args)
    if rating ~= 1 and rating ~= 0 and rating ~= -1 then
      return notify("usage: :FlywheelRateSuggestion 1|0|-1", vim.log.levels.ERROR)
    end
    M.rate_suggestion(rating)
  end, { nargs = 1 })
  cmd("FlywheelNextEdit", function() suggestions.request(0, M.next_edit_keys) end, {})
  cmd("FlywheelNextEditAccept", function() suggestions.tab() end, {})
  cmd("FlywheelNextEditDismiss", function() suggestions.dismiss() end, {})
  cmd("FlywheelToggleCompletion", function() -- in every buffer Flywheel serves, and new ones
    local on = not vim.lsp.inline_completion.is_enabled({ bufnr = 0 })
    M.options.inline_completion = on
    for _, c in ipairs(vim.lsp.get_clients({ name = "flywheel" })) do
      for b in pairs(c.attached_buffers) do
        vim.lsp.inline_completion.enable(on, { bufnr = b })
      end
    end
    notify("inline completion " .. (on and "on" or "off"))
  end, {})
  cmd("FlywheelConsent", function(o) M.consent(o.args) end, { nargs = "?", complete = function() return { "off", "metrics", "code" } end })
  cmd("FlywheelRestart", M.restart, {})
end

local function keymaps(k)
  if not k then
    return
  end
  local map = function(mode, lhs, rhs, desc)
    if lhs then vim.keymap.set(mode, lhs, rhs, { desc = "Flywheel: " .. desc }) end
  end
  map("i", k.accept_completion, function()
    if vim.lsp.inline_completion and vim.lsp.inline_completion.get() then return "" end
    return vim.api.nvim_replace_termcodes(k.accept_completion, true, false, true)
  end, "accept the ghost text")
  map("n", k.ask, ":FlywheelAsk ", "ask")
  map("x", k.ask, ":FlywheelAsk ", "ask about the selection")
  map("n", k.accept_hunk, function() M.review(true, false) end, "accept the hunk")
  map("n", k.reject_hunk, function() M.review(false, false) end, "reject the hunk")
  map("n", k.next_hunk, function() M.jump(1) end, "next hunk")
  map("n", k.prev_hunk, function() M.jump(-1) end, "previous hunk")
  map("n", k.rate_up, function() M.rate(1) end, "rate the last task up")
  map("n", k.rate_down, function() M.rate(-1) end, "rate the last task down")
  local function expr(mode, lhs, fn, desc, leave)
    if not lhs then return end
    vim.keymap.set(mode, lhs, function()
      local handled = fn()
      if handled and not leave then return "" end
      return vim.api.nvim_replace_termcodes(lhs, true, false, true)
    end, { expr = true, desc = "Flywheel: " .. desc })
  end
  expr("i", k.accept_word, function() return suggestions.accept_part("word") end, "accept the next word of the ghost text")
  expr("i", k.accept_line, function() return suggestions.accept_part("line") end, "accept the ghost text's line")
  expr({ "n", "i" }, k.next_edit_accept, suggestions.tab, "jump to the next edit, then apply it")
  expr("n", k.next_edit_dismiss, suggestions.dismiss, "dismiss the next edit")
  expr("i", k.next_edit_dismiss, suggestions.dismiss, "dismiss the next edit", true) -- and leave insert mode
end

--- The client's configuration for vim.lsp.config (lsp/flywheel.lua returns it with defaults).
function M.client_config(o)
  local settings = vim.tbl_isempty(o.settings) and vim.empty_dict() or o.settings
  return {
    cmd = o.cmd,
    filetypes = o.filetypes,
    root_markers = o.root_dir == nil and o.root_markers or nil,
    root_dir = type(o.root_dir) == "string" and function(_, on_dir) on_dir(o.root_dir) end or o.root_dir,
    init_options = settings,
    settings = { flywheel = settings },
    handlers = {
      ["flywheel/taskStep"] = on_step,
      ["flywheel/proposal"] = on_proposal,
      ["flywheel/status"] = function(_, params, ctx)
        local c = vim.lsp.get_client_by_id(ctx.client_id)
        if c and not c:is_stopped() then -- a message read before the exit must not undo "stopped"
          M.state.status = params
          status_changed()
        end
      end,
    },
    on_exit = function(code, signal)
      if code ~= 0 or signal ~= 0 then -- shown once per exit, in the statusline until a restart
        M.state.status = { state = "stopped", modelVersion = M.state.status.modelVersion or "",
          message = ("the server exited (code %d, signal %d); :FlywheelRestart"):format(code, signal) }
        vim.schedule(function() notify(M.state.status.message, vim.log.levels.ERROR) end)
      else
        M.state.status = { state = "stopped", modelVersion = "" }
      end
      M.state.progress = nil
      vim.schedule(status_changed)
    end,
  }
end

--- Options, commands, keymaps and autocommands; what `setup` does besides starting the server.
--- lsp/flywheel.lua calls it with no options (the defaults) unless `setup` ran first.
--- Ghost text must read as a suggestion in every terminal. Neovim's ComplHint (NonText) has only
--- a GUI colour, so without 'termguicolors' (tmux without RGB, a 256-colour terminal) it looked
--- like typed code. It gets a grey, italic terminal colour where it has none.
local function ghost_colour()
  local hl = vim.api.nvim_get_hl(0, { name = "ComplHint", link = false })
  if hl.ctermfg == nil then
    hl.ctermfg = 8 -- bright black: grey in 16- and 256-colour palettes
    hl.cterm = vim.tbl_extend("force", hl.cterm or {}, { italic = true })
    vim.api.nvim_set_hl(0, "ComplHint", hl)
  end
end

function M.init(opts)
  if M.options and opts == nil then
    return
  end
  M.options = vim.tbl_deep_extend("force", M.defaults, opts or {})
  if opts and opts.keymaps == false then
    M.options.keymaps = false
  end
  local o = M.options
  suggestions.options = vim.tbl_extend("force", suggestions.options, o.next_edit or {})
  M.next_edit_keys = {
    accept = o.keymaps and o.keymaps.next_edit_accept or nil,
    dismiss = o.keymaps and o.keymaps.next_edit_dismiss or nil,
  }
  local group = vim.api.nvim_create_augroup("flywheel", { clear = true })
  vim.api.nvim_create_autocmd("LspAttach", {
    group = group,
    callback = function(args)
      local c = vim.lsp.get_client_by_id(args.data.client_id)
      if not (c and c.name == "flywheel") then
        return
      end
      if o.inline_completion and vim.lsp.inline_completion then
        vim.lsp.inline_completion.enable(true, { bufnr = args.buf })
      end
      suggestions.attach(c, args.buf, M.next_edit_keys)
    end,
  })
  vim.api.nvim_create_autocmd("BufEnter", { group = group, callback = function() M.render() end })
  ghost_colour()
  vim.api.nvim_create_autocmd("ColorScheme", { group = group, callback = ghost_colour })
  vim.api.nvim_create_autocmd("LspProgress", { -- the model's preparation on a first start
    group = group,
    callback = function(args)
      local c = vim.lsp.get_client_by_id(args.data.client_id)
      local token, value = args.data.params.token, args.data.params.value
      if not (c and c.name == "flywheel" and tostring(token):find("^flywheel%-model%-")) then
        return
      end
      if value.kind == "end" then
        M.state.progress = nil
      else
        local was = M.state.progress or {}
        M.state.progress = { percentage = value.percentage or was.percentage, message = value.message or was.message }
      end
      show_progress(value)
      status_changed()
    end,
  })
  commands()
  keymaps(o.keymaps)
  if o.inline_completion and not vim.lsp.inline_completion then
    notify("this Neovim has no native inline completion (0.12+); ghost text is off", vim.log.levels.WARN)
  end
end

--- Everything: options (defaults above), the client's configuration, and the server started.
--- Without it, the three lines `flywheel lsp --setup` prints do the same with the defaults.
function M.setup(opts)
  if not (vim.lsp.config and vim.lsp.enable) then
    return notify("needs Neovim 0.11 or newer (vim.lsp.config)", vim.log.levels.ERROR)
  end
  M.init(opts or {})
  vim.lsp.config("flywheel", M.client_config(M.options))
  vim.lsp.enable("flywheel")
end

return M
