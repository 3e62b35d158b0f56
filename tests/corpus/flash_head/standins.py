"""Our stand-ins for flash-head 0.1.10's wrappers, in this project's wrap convention
(`impl(wrapped, instance, args, kwargs)`): each reads the parameters the plugin's wrapper reads, and forwards.
Not the plugin's code."""


def get_logits(wrapped, instance, args, kwargs):
    return wrapped(*args, **kwargs)


def sampler_forward(wrapped, instance, args, kwargs):
    return wrapped(*args, **kwargs)


def rejection_forward(wrapped, instance, args, kwargs):
    return wrapped(*args, **kwargs)


def greedy_sample(self, hidden_states):
    """Replacement with the plugin's signature (it never calls the original)."""
    ...


def dummy_sampler_run(wrapped, instance, args, kwargs):
    return wrapped(*args, **kwargs)


def from_engine_args(wrapped, instance, args, kwargs):
    return wrapped(*args, **kwargs)


def async_llm_init(wrapped, instance, args, kwargs):
    return wrapped(*args, **kwargs)
