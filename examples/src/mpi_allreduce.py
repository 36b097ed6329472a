"""An mpi4py allreduce that also reads the variables Azure ML gives MPI jobs."""

import json
import os
import socket

from mpi4py import MPI

comm = MPI.COMM_WORLD
total = comm.allreduce(comm.Get_rank() + 1, op=MPI.SUM)
master_addr, master_port = os.environ["AZ_BATCH_MASTER_NODE"].split(":")
with open(os.environ["AZUREML_MPI_HOSTFILE"]) as hostfile:
    hosts = hostfile.read().split("\n")
report = {
    "rank": int(os.environ["OMPI_COMM_WORLD_RANK"]),
    "size": int(os.environ["OMPI_COMM_WORLD_SIZE"]),
    "local_rank": int(os.environ["OMPI_COMM_WORLD_LOCAL_RANK"]),
    "local_size": int(os.environ["OMPI_COMM_WORLD_LOCAL_SIZE"]),
    "mpi_rank": comm.Get_rank(),
    "allreduce": total,
    "master": [master_addr, int(master_port)],
    "hostfile": [h for h in hosts if h],
    "host": socket.gethostname(),
}
print("RESULT " + json.dumps(report), flush=True)
