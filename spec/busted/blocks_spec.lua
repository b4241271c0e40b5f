-- Run by spec/busted_helper_spec.lua with -Xhelper timeout=1.5: a test's
-- before_each, body and after_each share one run, and each block ends as
-- a test does (its tasks waited for, their unjoined failures reported on
-- it). Lines marked in comments are checked by the parent.
local ums = require "ums"
local helper = require "ums.busted"

describe("#virtual one run per test", function()
  local task, runs, started_done

  before_each(function()
    task, runs = ums.self(), helper.test_runs
    started_done = false
    ums.spawn(function()
      ums.sleep(10)
      started_done = true
    end)
    ums.sleep(60)
  end)

  after_each(function()
    assert.equal(task, ums.self())
    assert.equal(runs, helper.test_runs)
  end)

  it("the body runs in before_each's task, in the same run", function()
    assert.equal(task, ums.self())
    assert.equal(runs, helper.test_runs)
    assert.is_true(ums.now() >= 60)
  end)

  it("a task before_each started was waited for at its end", function()
    assert.is_true(started_done)
  end)
end)

describe("a before_each whose task fails with nobody joining it", function()
  local n = 0
  before_each(function()  -- line 39
    n = n + 1
    if n == 1 then
      ums.spawn(function() error("lost in before_each") end)  -- line 42
    end
  end)

  it("fails its own test", function() end)

  it("and not the next", function() end)
end)

describe("a body whose task fails after the body returned", function()
  it("fails, once its task has ended", function()  -- line 52
    ums.spawn(function()
      ums.sleep(0.01)
      error("lost after the body")  -- line 55
    end)
  end)

  it("and the next test passes", function() end)
end)

describe("the timeout", function()
  local after_ran = false

  -- Each block takes 0.9 s of the 1.5: the two pass the timeout, one
  -- alone leaves room for a slow (sanitizer, loaded) start.
  before_each(function() ums.sleep(0.9) end)
  after_each(function()
    after_ran = true
    ums.sleep(0.001)  -- raises ums.CANCELLED, silently
  end)

  it("covers the whole test", function()  -- line 73
    ums.sleep(0.9)
  end)

  it("and after_each still ran", function()
    assert.is_true(after_ran)
  end)
end)
