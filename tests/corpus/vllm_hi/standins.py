"""Our stand-ins for vllm-hi 0.1.0's fixed-signature wrappers: each has the signature of the plugin's wrapper (which
calls the original with those parameters only), so they are declared as `replace` patches that copy nothing
(`reimplements: []`) and check sees the signature vLLM's calls must fit. Not the plugin's code."""


async def create_chat_completion(self, request, raw_request=None):
    """The plugin's logging wrapper: (self, request, raw_request=None), then the original with raw_request=."""
    ...


async def init_app_state(engine_client, state, args, supported_tasks=None):
    """The plugin's init_app_state wrapper: four parameters, supported_tasks passed on by keyword."""
    ...


async def run_server(args, **uvicorn_kwargs):
    """The plugin's run_server wrapper: args, then uvicorn keywords."""
    ...


# The RPC methods vllm-hi adds to EngineCore and Worker (`adds: true`): our stand-ins, called by name.


def _vllm_hi_get_scheduler_state(self, *args, **kwargs):
    ...


def _vllm_hi_set_scheduler_state(self, *args, **kwargs):
    ...


def _vllm_hi_apply_scheduler_incremental(self, *args, **kwargs):
    ...


def _vllm_hi_export_kv_ipc(self, *args, **kwargs):
    ...


def _vllm_hi_set_kv_ipc(self, *args, **kwargs):
    ...


def _vllm_hi_collect_kv_cache(self, *args, **kwargs):
    ...


def _vllm_hi_try_get_result(self, *args, **kwargs):
    ...
