"""Why a job failed or hangs, and what it uses, read from what its processes print and what
their agents report; nothing here starts or stops a process.

- root_cause: the evidence stderr leaves as it streams, and the RootCause made from it;
- culprit: which of several failed ranks is to blame, and which are collateral;
- attribute: which rank a launcher's (torchrun's, mpirun's) line belongs to;
- hints: one line of advice for failures everybody hits;
- stall: a job that stopped moving;
- stacks: every rank's Python stack, grouped;
- meters: CPU, memory and GPU use per rank, from the agents' reports.
"""
