"""The design proposal's jobs (examples/proposal/) all run `python train.py`: this runs the
example of their kind, chosen by what the launcher gave the process. TF_CONFIG: TensorFlow
(tf_mwms_train.py); Horovod's ranks (started by horovodrun or mpirun): Horovod with PyTorch
(horovod_train.py); otherwise PyTorch DDP (ddp_train.py). The proposal's own arguments
(`--language $LANGUAGE`, `--magic $MAGIC`) are said, then left to this file."""

import os
import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def chosen() -> str:
    if "TF_CONFIG" in os.environ:
        return "tf_mwms_train.py"
    if "OMPI_COMM_WORLD_RANK" in os.environ or "HOROVOD_RANK" in os.environ:
        return "horovod_train.py"
    return "ddp_train.py"


if __name__ == "__main__":
    script = chosen()
    if sys.argv[1:]:
        print(f"train.py {' '.join(sys.argv[1:])}: running {script}", flush=True)
    sys.argv = [str(HERE / script)]
    runpy.run_path(sys.argv[0], run_name="__main__")
