"""The ground floor: the base types every stage shares, importing nothing of leakdoctor beyond this package.

metric.py: a metric's spec and the probe; integration.py: the forensic, cleanup and integration types; evidence.py: what an
investigation hands the rules, and the rule; findings.py: the finding, a remedy's outcome, a series' summary;
trend.py: the trend statistics; guard.py: the guard and LeakDoctorWarning; schema.py: the summary file's
names; units.py: units and how values read; source.py: the user's code as seen from inside the doctor;
remedy_names.py: the remedies' names and levels; version.py: the version.

The stages above, bottom to top: settings, reading, integrations, remedies, judging, reporting, lifecycle,
the engine (doctor.py, _options.py), callbacks, runner, and the entry points (cli, pytest_plugin, demo, the
package root). Each imports only this floor and the floors below it (tests/test_import_graph.py). This file
imports nothing, so that importing one module here loads no other (`leakdoctor run` imports nothing before
the script does).
"""
