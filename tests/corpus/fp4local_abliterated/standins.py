"""Our stand-ins for fp4local-abliterated 0.1.0's loader wrappers, in this project's wrap convention. Not the
plugin's code."""


def prepare_weights(wrapped, instance, args, kwargs):
    return wrapped(*args, **kwargs)


def get_weights_iterator(wrapped, instance, args, kwargs):
    return wrapped(*args, **kwargs)
