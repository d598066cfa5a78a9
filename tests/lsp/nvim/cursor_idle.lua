-- The cursor rests: the plugin tells the server where (flywheel/cursorIdle), and the server
-- prefills the prompt a completion there would send. Neovim fires CursorHold after 'updatetime'
-- without a key only while a UI waits for input; headless, the test fires it.
local T = dofile(vim.fn.fnamemodify(debug.getinfo(1, "S").source:sub(2), ":h") .. "/common.lua")

local function warm_ups()
  local out = {}
  for _, r in ipairs(T.request("flywheel/test/requests").requests) do
    if r.maxTokens == 1 then
      table.insert(out, r)
    end
  end
  return out
end

T.run(function()
  T.start()
  -- opening the buffer warms its head first (the server does it on didOpen)
  T.wait("the open's warm-up", 60000, function() return #warm_ups() > 0 end)
  T.results.opened = warm_ups()[1].prompt
  vim.api.nvim_win_set_cursor(0, { 2, 4 }) -- in `return a - b`, after the indentation
  vim.api.nvim_exec_autocmds("CursorHold", { buffer = 0, modeline = false })
  T.wait("a warm-up where the cursor rests", 60000, function() return #warm_ups() > 1 end)
  local rest = warm_ups()[2]
  T.results.priority = rest.priority
  T.results.prompt = rest.prompt
end)
