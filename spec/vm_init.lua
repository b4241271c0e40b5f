-- spec/vm_init.lua: the init module of vm_spec.lua's runs. Counts how
-- often it ran in this VM (a global of the VM), which must be once.
INIT_COUNT = (INIT_COUNT or 0) + 1
return true
