"""The chaos run's plan and its tally (tests/chaos/README.md): what faults a seed schedules, how
many of each kind the run must inject, and the summary line that says how many it did. Pure
functions of their arguments and a plain counter: no processes, no cluster, no clock; not
thread-safe (chaos.py uses them from its main loop only). Standard library only.
"""

import collections
import random

LOCAL_FAULTS = ("rank-kill", "worker-kill", "worker-stop", "agent-term")
GLOBAL_FAULTS = ("operator-kill", "api-faults", "shm-full")
API_KINDS = ("api-500", "api-429", "api-409", "api-watch-cut", "api-latency")
# Every kind the tally counts, in the order the table and the summary line list them: a fault
# of the schedule (api-faults counts as api-window) or an API rule's kind.
KINDS = LOCAL_FAULTS + ("operator-kill", "api-window") + API_KINDS + ("shm-full",)
RESTARTING = ("rank-kill", "agent-term")  # the local faults that make the gang restart
# What the retryable jobs retry on (with retryOn given, the default 128-255 no longer applies):
# signals from outside and a gang started while /dev/shm was full (an agent that could not
# start says itself whether that is retryable: AgentError is no retryOn value).
RETRY_ON = ["Killed", "OOMKilled", "Terminated", "Crashed", "ShmExhausted"]
# The requests the operator makes through the proxy (its client: list, watch, get, create,
# update, delete; it never patches), and those an API window is sure to hold: the operator
# SIGKILLed in it lists and watches again, and the job's restart after it writes the job's
# status (update) and records events (create). A rule only fires on a request it matches.
OPERATOR_VERBS = ("list", "watch", "get", "create", "update", "delete")


def kind_of(fault):
    """The tally's kind of a scheduled fault."""
    return "api-window" if fault["kind"] == "api-faults" else fault["kind"]


def make_schedule(seed, seconds):
    """Jobs and, per job, the faults fired while it runs: each `after` seconds of the job's
    Running phase (counted from its last start of Running or from its previous fault,
    whichever is later). Every job but the last gets a gang restart (a rank SIGKILLed or an
    agent SIGTERMed) and one or two loader faults; the run's shared faults (the operator,
    the API, /dev/shm) come just before a job's restart, so that the restart happens under
    them. Every API window holds an operator restart (its lists and watches meet the rules)
    and then its job's restart; the first window holds a rule of every API kind. The last job
    is given a budget its fault exceeds (maxRestarts 0)."""
    rng = random.Random(seed)
    n_jobs = max(2, int(round(seconds / 30.0)))
    jobs = []
    for i in range(n_jobs):
        budget_job = i == n_jobs - 1
        job = {"name": "chaos-%d" % i, "mode": rng.choice(["InPlace", "Recreate"]),
               "workers": rng.choice([1, 2]), "epochs": rng.choice([4, 5]),
               "budget": budget_job, "faults": []}
        if budget_job:
            kinds = ["rank-kill"]
        else:
            others = [k for k in LOCAL_FAULTS if k not in RESTARTING]
            kinds = [rng.choice(RESTARTING)] + rng.sample(others, rng.choice([1, 2]))
            rng.shuffle(kinds)
        for kind in kinds:
            job["faults"].append({"kind": kind, "node": rng.randrange(2),
                                  "after": round(rng.uniform(2, 8), 1)})
        jobs.append(job)

    def before_restart(job, fault, lead, kinds=RESTARTING):
        """Puts fault just before the job's first restarting fault (of `kinds`) not yet
        preceded by a shared one, which then follows it within `lead` seconds: that fault,
        or None (fault then goes anywhere)."""
        faults = job["faults"]
        for k, f in enumerate(faults):
            if f["kind"] in kinds and (k == 0 or faults[k - 1]["kind"] in LOCAL_FAULTS):
                f["after"] = round(rng.uniform(0.5, lead), 1)
                faults.insert(k, fault)
                return f
        faults.insert(rng.randrange(len(faults) + 1), fault)
        return None

    def shared(kind, api_kinds=None):
        fault = {"kind": kind, "after": round(rng.uniform(1, 6), 1)}
        if kind == "operator-kill":
            fault["down"] = round(rng.uniform(0.5, 5), 1)
        elif kind == "api-faults":
            fault["window"] = round(rng.uniform(15, 25), 1)
            fault["rules"] = api_rules(rng, api_kinds)
        else:  # long enough for the restarted rank to reach its Loader (its ring) under it
            fault["window"] = round(rng.uniform(6, 10), 1)
        return fault

    def api_window(job, api_kinds=None):
        """API faults, the operator SIGKILLed 1 to 3 s into them, then the job's restart."""
        api, kill = shared("api-faults", api_kinds), shared("operator-kill")
        kill["after"] = round(rng.uniform(1, 3), 1)
        before_restart(job, kill, 3)
        job["faults"].insert(job["faults"].index(kill), api)

    api_window(jobs[0], API_KINDS)
    # One more shared fault for each other retryable job; /dev/shm full at least once.
    anchors = list(range(1, n_jobs - 1)) or [0]
    kinds = ["shm-full"] + [rng.choice(GLOBAL_FAULTS) for _ in anchors[1:]]
    rng.shuffle(kinds)
    for k, kind in enumerate(kinds):
        job = jobs[anchors[k]]
        if kind == "api-faults":
            api_window(job)
            continue
        fault = shared(kind)
        if kind != "shm-full":
            before_restart(job, fault, 4)
            continue
        # Under a full /dev/shm only a rank restarted in place starts (see shm_quiet).
        job["mode"] = "InPlace"
        kill = before_restart(job, fault, 1.5, kinds=("rank-kill",))
        if kill is None:
            kill = {"kind": "rank-kill", "node": rng.randrange(2),
                    "after": round(rng.uniform(0.5, 1.5), 1)}
            job["faults"].insert(job["faults"].index(fault) + 1, kill)
        kill["under_shm"] = True
    for job in jobs:
        set_budget(job)
    return jobs


def set_budget(job):
    """maxRestarts: 0 for the budget job; else its restarting faults + 4, a margin for the
    run's shared faults, + 4 more when a rank is to restart under a full /dev/shm (a gang
    started while it is full fails, retryably here, and may fail again, after backoff, until
    the window ends)."""
    planned = sum(1 for f in job["faults"] if f["kind"] in RESTARTING)
    under_shm = any(f.get("under_shm") for f in job["faults"])
    job["maxRestarts"] = 0 if job["budget"] else planned + 4 + (4 if under_shm else 0)


def unreachable_schedule():
    """Test only (--unreachable-fault): one short retryable job whose only fault can never be
    injected, a rank SIGKILLed on node 2 of a two-node job. The run must end with missed=1."""
    job = {"name": "chaos-0", "mode": "InPlace", "workers": 1, "epochs": 2, "budget": False,
           "faults": [{"kind": "rank-kill", "node": 2, "after": 0.5}]}
    set_budget(job)
    return [job]


def api_rules(rng, kinds=None):
    """One fault-proxy rule (tools/faultproxy/faults.go) per kind (`kinds`, or 2 to 4 drawn),
    each failing the first `count` requests it matches in its window (rate 1), on requests
    the window is sure to hold (OPERATOR_VERBS): 500 and 429 on list or update (the operator
    retries both), 409 on update or create, latency on anything, and watches of TrainingJobs
    cut right after their headers or after their first event, or in the middle of it (the
    operator's status writes make those events). Codes go to verbs watches never use, so no
    cut is lost to a code that answered its request instead."""
    if kinds is None:
        kinds = rng.sample(API_KINDS, rng.choice([2, 3, 4]))
    rules = []
    for kind in kinds:
        if kind == "api-500":
            rules.append((kind, "code=500,verb=%s,count=%d" % (
                rng.choice(["list", "update"]), rng.randint(1, 3))))
        elif kind == "api-429":
            rules.append((kind, "code=429,retryAfter=1,verb=%s,count=%d" % (
                rng.choice(["list", "update"]), rng.randint(1, 2))))
        elif kind == "api-409":
            verb = rng.choice(["update", "create"])
            rules.append((kind, "code=409,verb=%s,count=%d" % (
                verb, rng.randint(1, 2) if verb == "update" else 1)))
        elif kind == "api-watch-cut":
            rules.append((kind, "verb=watch,resource=trainingjobs,cutAfterEvents=%d,"
                                "midLine=%s,count=%d" % (rng.randrange(0, 2),
                                                         rng.choice(["true", "false"]),
                                                         rng.randint(1, 3))))
        else:
            rules.append((kind, "latencyMs=%d,count=%d" % (rng.randrange(50, 400),
                                                           rng.randint(2, 8))))
    return rules


def planned(jobs):
    """{kind: how many the schedule plans}: faults by kind, API rules by their kind. Each is
    the minimum the run must inject (an API rule: fire at least once) to pass."""
    counts = collections.Counter()
    for job in jobs:
        for f in job["faults"]:
            counts[kind_of(f)] += 1
            for rule_kind, _ in f.get("rules", ()):
                counts[rule_kind] += 1
    return counts


def schedule_lines(seed, seconds, jobs):
    """The schedule as the run prints it before anything starts."""
    lines = ["chaos schedule seed=%d seconds=%d jobs=%d" % (seed, seconds, len(jobs))]
    for job in jobs:
        lines.append("  job %s mode=%s workersPerRank=%d epochs=%d maxRestarts=%d%s" % (
            job["name"], job["mode"], job["workers"], job["epochs"], job["maxRestarts"],
            " (budget exceeded: expect Failed)" if job["budget"] else ""))
        for f in job["faults"]:
            extra = ""
            if "node" in f:
                extra = " node=%d" % f["node"]
            if "down" in f:
                extra += " down=%ss" % f["down"]
            if "window" in f:
                extra += " window=%ss" % f["window"]
            if "rules" in f:
                extra += " rules=%s" % ";".join(r for _, r in f["rules"])
            lines.append("    +%4.1fs running: %s%s" % (f["after"], f["kind"], extra))
    plan = planned(jobs)
    lines.append("minimum to inject: %s" % " ".join(
        "%s=%d" % (k, plan[k]) for k in KINDS if plan[k]))
    return lines


class Tally(object):
    """Faults planned, injected and missed, by kind. A fault of the schedule is injected once
    or missed once, with the reason; an API rule fires any number of times (each firing is an
    injected fault) and is missed when it never fired."""

    def __init__(self, jobs):
        self.planned = planned(jobs)
        self.injected = collections.Counter()  # faults; API kinds: firings
        self.fired_rules = collections.Counter()  # API kinds: rules that fired at least once
        self.missed = collections.Counter()
        self.reasons = []  # (kind, why), in the order they were missed

    def inject(self, kind):
        self.injected[kind] += 1

    def rule_read(self, kind, fired, what=""):
        """An API rule of kind (`what`: its spec and job), read back at its window's end with
        `fired` firings."""
        if fired:
            self.fired_rules[kind] += 1
            self.injected[kind] += fired
        else:
            self.miss(kind, "%s%s fired 0 times" % (kind, what))

    def miss(self, kind, why):
        self.missed[kind] += 1
        self.reasons.append((kind, why))

    def close(self):
        """Counts each planned fault neither injected nor missed yet as missed (the run
        ended before it came to it)."""
        for kind in KINDS:
            done = self.missed[kind] + (self.fired_rules[kind] if kind in API_KINDS
                                        else self.injected[kind])
            for _ in range(self.planned[kind] - done):
                self.miss(kind, "%s: the run ended before it was injected" % kind)

    def total_missed(self):
        return sum(self.missed.values())

    def per_kind(self):
        """'kind=injected/missed' for every kind, in KINDS order."""
        return " ".join("%s=%d/%d" % (k, self.injected[k], self.missed[k]) for k in KINDS)
