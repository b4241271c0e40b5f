-- spec/vm_init_fail1.lua: an init module that fails in every VM but the
-- main one, which vm_spec.lua marks with the global VM_MAIN (a scheduler
-- whose VM cannot be set up refuses work, and the others take it).
if not VM_MAIN then error("no VM but the main one") end
return true
