"""Our stand-ins for agentinfer-zmj-test 0.1.1: the scheduler bridges with the plugin's override signatures (bodies
call super()), and its wrappers in this project's wrap convention. Not the plugin's code."""

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler


class _Overrides:
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)

    def add_request(self, request) -> None:
        super().add_request(request)

    def schedule(self, *args, **kwargs):
        return super().schedule(*args, **kwargs)

    def update_from_output(self, scheduler_output, model_runner_output):
        return super().update_from_output(scheduler_output, model_runner_output)

    def finish_requests(self, request_ids, finished_status):
        return super().finish_requests(request_ids, finished_status)

    def get_num_unfinished_requests(self) -> int:
        return super().get_num_unfinished_requests()


class SyncSchedulerBridge(_Overrides, Scheduler):
    pass


class AsyncSchedulerBridge(_Overrides, AsyncScheduler):
    pass


def get_computed_blocks(wrapped, instance, args, kwargs):
    return wrapped(*args, **kwargs)


def get_computed_blocks_closure(self, request):
    """The plugin's closure takes the request alone (its shape, not its code)."""
    ...


def build_base_request(wrapped, instance, args, kwargs):
    return wrapped(*args, **kwargs)
