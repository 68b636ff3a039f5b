"""The calibration harness: designs equivalent to the published ones, timed by the model, against silicon.

It sits above kernels, plan and runtime because it builds designs and plans; the constants it fits live in
``npu/calibration.py``, below everything that reads them.
"""
