/*
** lext.h: going preemptive from a C function of the binding (lext.c),
** the form ums_lua_preempt and ums.ffi calls share.
*/
#ifndef LEXT_H
#define LEXT_H

#include "lums.h"

/* For the current task t: hands fn(arg) to the C-call pool
** (ums_preempt_begin_spin, storing the call in *call) and ends the park with
** lums_park_finish, so k runs once the call has returned or been given up.
** When the call returned during the runtime's spin at the call site, no park
** was begun and k runs at once, with status LUA_OK (after a park:
** LUA_YIELD), so k must read ums_park_result() only when status is not
** LUA_OK. On failure to start, the runtime has called release(arg) and this
** raises (naming `name`, or, if it is NULL, the running function; or
** ums.CANCELLED). */
LUMS_HIDDEN int lums_preempt_start(lua_State *L, ltask *t, const char *name,
                                   ums_preempt_fn fn, void *arg,
                                   ums_preempt_fn release, int64_t deadline,
                                   ums_preempt_call_t **call,
                                   lua_KContext ctx, lua_KFunction k);
/* In k, settles the call: returns 0 (it returned; arg is the
** caller's again) or UMS_ETIMEDOUT (given up; arg is the runtime's);
** raises ums.CANCELLED when the task was cancelled, or an error. */
LUMS_HIDDEN int lums_preempt_settle(lua_State *L, ums_preempt_call_t *call,
                                    const char *name);
/* The same for a call whose record the caller prepared
** (ums_preempt_prepare): begins it with ums_preempt_begin_prepared (on
** failure the record is gone too); k then settles it with
** lums_preempt_settle_copy, which on 0 first copies n bytes of the
** record's inline area to out (ums_preempt_end_copy). */
/* interrupt: UMS_PREEMPT_INTERRUPT, a task giving up interrupts fn. */
LUMS_HIDDEN int lums_preempt_start_prepared(lua_State *L, ltask *t,
                                            const char *name,
                                            ums_preempt_call_t *call,
                                            ums_preempt_fn fn, void *arg,
                                            ums_preempt_fn release,
                                            int64_t deadline, bool interrupt,
                                            lua_KContext ctx,
                                            lua_KFunction k);
LUMS_HIDDEN int lums_preempt_settle_copy(lua_State *L,
                                         ums_preempt_call_t *call,
                                         const char *name, void *out,
                                         size_t n);

#endif
