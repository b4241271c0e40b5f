# gdb script: the runtime's state in a hung ums process, printed by
# fuzz.sh next to the threads' stacks (usable by hand too:
# gdb -p PID -batch -x test/fuzz/hang-state.py).
#
# For each scheduler thread idle in its wait: what could still wake it
# (I/O and C calls in flight, idle waiters, timers armed), its tasks, and
# the deadlock detector's state; then every live task's park: its wait
# type, whether cancellation can end it, what it waits on and who holds
# that. A hang with every scheduler stuck and the detector's state equal
# to the sum of stuck_seq means the detector has seen it and nothing it
# did could end a wait.
import gdb

FIELDS = ["id", "io_pending", "preempt_pending", "io_pool_pending",
          "nidle_waiters", "runq_n", "nlocal", "stuck", "stuck_seq"]


def scheduler_frames():
    for th in gdb.selected_inferior().threads():
        th.switch()
        f = gdb.newest_frame()
        while f is not None:
            if f.name() == "block":
                yield th, f
                break
            f = f.older()


def show():
    gdb.execute("set pagination off")
    rt = None
    for th, f in scheduler_frames():
        f.select()
        try:
            s = gdb.parse_and_eval("s")
        except gdb.error as e:
            print("thread %d: scheduler state unavailable: %s" % (th.num, e))
            continue
        vals = ", ".join("%s=%s" % (k, s[k]) for k in FIELDS)
        print("scheduler (thread %d): %s, timers=%s" %
              (th.num, vals, s["timers"]["n"]))
        rt = s["rt"]
    if rt is None:
        print("no scheduler is in its idle wait")
        return
    print("runtime: live=%s exiting=%s on_deadlock=%s deadlock_state=%s "
          "deadlock_broken=%s" % (rt["live"], rt["exiting"],
                                  rt["cfg"]["on_deadlock"],
                                  rt["deadlock_state"],
                                  rt["deadlock_broken"]))
    n = int(rt["nslots"])
    for slot in range(n):
        t = rt["chunks"][slot // 1024][slot % 1024]
        if int(t["id"]) == 0 or bool(t["done"]):
            continue
        w = t["wait"]
        desc = "state=%s cancelled=%s" % (t["state"], t["cancelled"])
        if int(w) != 0:
            desc += (" wait type=%d nocancel=%s obj=%s blocker=%s" %
                     (int(w["type"]), w["nocancel"], w["obj"],
                      w["blocker"]))
        print("task %d (%s): %s" % (int(t["id"]), t["name"].string(), desc))


try:
    show()
except gdb.error as e:
    print("hang-state.py: %s" % e)
