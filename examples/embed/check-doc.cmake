# Fails unless DOC contains SOURCE verbatim inside a ```c block.
file(READ "${DOC}" doc)
file(READ "${SOURCE}" source)
string(FIND "${doc}" "```c\n${source}```" at)
if(at EQUAL -1)
  message(FATAL_ERROR "${DOC} does not contain ${SOURCE} verbatim in a "
                      "```c block: copy it there again")
endif()
message(STATUS "${DOC} has ${SOURCE} verbatim")
