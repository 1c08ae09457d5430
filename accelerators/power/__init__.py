"""Power and energy of devices: sensors (NVML, RAPL, hwmon, XRT, OPAE) or a model estimate."""
