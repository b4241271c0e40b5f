-- jobs.lua: the Lua side of the job runner (jobrun.c). Each function is a
-- job a host submits by name ("jobs.sum"); `host` is the table of C
-- functions the runner registers in every VM before any work.
local ums = require "ums"

local M = {}

function M.sum(...)
  local s = 0
  for i = 1, select("#", ...) do s = s + select(i, ...) end
  return s
end

function M.greet(name)
  host.log("greeting " .. tostring(name))
  return "hello, " .. tostring(name)
end

function M.fail(msg)
  error(msg or "job failed")
end

function M.sleep(seconds, value)
  ums.sleep(seconds)
  return value
end

-- Counts the primes below n; computes without waiting (the quantum makes
-- it yield to the other jobs of its scheduler).
function M.primes(n)
  local count = 0
  for i = 2, n - 1 do
    local prime = true
    for d = 2, math.floor(math.sqrt(i)) do
      if i % d == 0 then prime = false; break end
    end
    if prime then count = count + 1 end
  end
  return count
end

-- Work that spreads work: n pieces submitted to the least-loaded
-- schedulers (their own VMs), joined here.
function M.fanout(n)
  local pieces = {}
  for i = 1, n do pieces[i] = ums.submit("jobs.sum", i, i) end
  local total = 0
  for i = 1, n do
    local ok, v = pieces[i]:join()
    assert(ok, v)
    total = total + v
  end
  return total
end

return M
