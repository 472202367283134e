"""``module_db`` (float32) on neuron against the CPU, one test per module (forward, backward, buffers).

See ``torch_neuron_testing.modules``; subsampling: ``TORCH_NEURON_OPINFO_SAMPLES`` module inputs per module.
"""

import pytest
from torch_neuron_testing import modules, report, settings

CASES = [pytest.param(dname, info, id=report.param_id(dname, info.name))
         for dname, dtype in modules.DTYPES.items() for info in modules.modules_for(dtype)]


@pytest.mark.parametrize("dname, info", CASES)
def test_module_db(dname, info, record_property):
    first = settings.samples_per_op()
    report.run_entry(record_property, f"module_db.{dname}", info.name,
                     lambda extra: modules.run_module(info, modules.DTYPES[dname], first, extra))
