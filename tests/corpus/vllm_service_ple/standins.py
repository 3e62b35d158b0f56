"""Our stand-ins for vllm-service-ple 0.2.2's replacements: the plugin's fixed signatures (its shapes, not its code).
Each is set on the class or module in the original's place; the plugin's bodies call the saved original except on
the remote-table path."""


def allocate_embedding_weight(self, num_embeddings, embedding_dim, dtype):
    """Remote table: a one-row pinned placeholder expanded to the full shape; otherwise the original."""
    ...


def lookup(self, input_ids, output=None):
    """Remote table: rows fetched over the network into `output`; otherwise the original."""
    ...


def process_weights_after_loading(self, layer):
    """Remote table: the global FP8 scale from the server, then the original."""
    ...


def filter_duplicate_safetensors_files(hf_weights_files, hf_folder, index_file):
    """The original; a missing table file is tolerated in remote mode."""
    ...
