# The fuzz targets (tests/fuzz/fuzz_<name>.cpp), shared by the fuzz build and the main build's
# CTest entries.
set(GPUFENCE_FUZZ_TARGETS selector oci_spec cdi_spec containerd_config ldcache doctor_parse
    runc_args quantity go_match nri_wire)
