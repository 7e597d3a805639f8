"""The settings of a run (the first layer of the pipeline: it imports no other):
the sections of the config file, the registry of methods (:mod:`.registry`, naming each
method's module without importing it), presets, and the objects and checks the settings
make (:mod:`.build`, :mod:`.checks`)."""
