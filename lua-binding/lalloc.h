/*
** lalloc.h: a VM's cache of small freed blocks (lalloc.c), installed
** in front of its allocator while the VM runs tasks.
*/
#ifndef LALLOC_H
#define LALLOC_H

#include "lums.h"

/* Puts a cache of small freed blocks in front of L's allocator
** (lua_setallocf), for as long as L runs tasks. NULL when out of memory
** (then nothing changes). */
LUMS_HIDDEN lalloc *lums_alloc_install(lua_State *L);
/* Gives every cached block back to the allocator underneath and, if the
** cache's allocator is still L's, puts that one back (L NULL: the VM is
** closed already). NULL is ignored. */
LUMS_HIDDEN void lums_alloc_remove(lua_State *L, lalloc *a);

#endif
