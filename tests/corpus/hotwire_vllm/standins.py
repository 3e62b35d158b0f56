"""Our stand-ins for hotwire-vllm 0.1.2's wrappers, in this project's wrap convention: each reads what the
plugin's wrapper reads and forwards the call unchanged. Not the plugin's code."""


def v2_add_requests(wrapped, instance, args, kwargs):
    return wrapped(*args, **kwargs)


def v2_execute_model(wrapped, instance, args, kwargs):
    return wrapped(*args, **kwargs)


def v1_execute_model(wrapped, instance, args, kwargs):
    return wrapped(*args, **kwargs)


def compute_hash(wrapped, instance, args, kwargs):
    return wrapped(*args, **kwargs)
