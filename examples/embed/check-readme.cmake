# Fails unless README contains SOURCE verbatim inside a ```c block.
file(READ "${README}" readme)
file(READ "${SOURCE}" source)
string(FIND "${readme}" "```c\n${source}```" at)
if(at EQUAL -1)
  message(FATAL_ERROR "README.md does not contain ${SOURCE} verbatim in a "
                      "```c block: copy it there again")
endif()
message(STATUS "README.md has ${SOURCE} verbatim")
