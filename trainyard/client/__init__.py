"""Trainyard's client: submit a training script from your own machine and follow it, in
Python or from the `trainyard` command. Installed with the `client` extra
(`pip install 'trainyard[client]'`, or `pip install '.[client]'` in the repository); job
processes never import it.

    from trainyard.client import Studio

    studio = Studio("http://127.0.0.1:8000", token)
    job = studio.run(entry_point="train.py", source_dir="src", distribution="ddp",
                     processes_per_node=2, hyperparameters={"lr": 0.1})
    job.wait()
    print(job.status, job.failure_reason, job.logs()[-5:])

`Studio()` without arguments reads TRAINYARD_URL / TRAINYARD_TOKEN, else what
`trainyard login` stored."""

from trainyard.client.http import ApiError, StudioUnreachable
from trainyard.client.studio import Job, Studio

__all__ = ["ApiError", "Job", "Studio", "StudioUnreachable"]
