"""A job's life, from its plan to its end: launch (plan, claim ports, record, start), job
(one owner of the processes: start all or none, stream, fail fast, stop, sweep), output
(lines to the store, then to listeners), stopping (the grace period), claims (fixed ports
held from planning to the end), requests (cancel and stacks asked by other processes
through the store), session (warm ranks that run cell after cell), cell_values (a cell's
variables in and out). Why a job failed or hangs is diagnose/'s; where processes run is
backends/'."""
