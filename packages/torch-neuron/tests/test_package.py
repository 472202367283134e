import pytest

import torch_neuron


def test_unbuilt_backend_says_so():
    with pytest.raises(NotImplementedError, match="not built yet"):
        _ = torch_neuron.is_available
