"""Our stand-in for raif-vllm 0.2.0's render wrapper, in this project's wrap convention: it reads the request (the
plugin's wrapper takes (self, request, *args, **kwargs), rewrites the request, then awaits the original with
everything). Not the plugin's code."""


def render_chat_request(wrapped, instance, args, kwargs):
    return wrapped(*args, **kwargs)
