# Install rules: `cmake --install <build dir> [--prefix P] [--component C]` (docs/deploy.md).
#
# Layout under the prefix (default /usr/local):
#   bin/                     trainshardd, ts_shard, ts_worker, trainshard, and the tokenizer's
#                            SentencePiece shim libts_sentencepiece_shim.so. They stay side by
#                            side: trainshardd starts ts_shard and ts_worker from beside itself
#                            (common::SiblingExecutable), and the tokenizer opens the shim from
#                            beside the running executable (worker/tokenizer.cc).
#   lib/systemd/system/      trainshardd.service and trainshard-devnet.service, their paths
#                            rewritten to this prefix at install time
#   lib/sysusers.d/          trainshard.conf: the users the units run as
#   share/trainshard/        the example config, the devnet genesis example, the CUDA drop-in
#   share/doc/trainshard/    README.md and docs/*.md
#
# Components: runtime (the programs), systemd (units and users), examples, doc. ts_worker (and
# the shim) exist only where the worker is built (GCC, worker/CMakeLists.txt); elsewhere the
# other programs are installed without it.
include_guard(GLOBAL)
include(GNUInstallDirs)

# systemd reads units from /usr/local/lib/systemd/system as well as /usr/lib/systemd/system.
set(TS_INSTALL_SYSTEMD_UNIT_DIR "lib/systemd/system" CACHE STRING
    "where systemd units go, relative to the prefix")
set(TS_INSTALL_SYSUSERS_DIR "lib/sysusers.d" CACHE STRING
    "where the sysusers.d file goes, relative to the prefix")

set(ts_install_programs trainshardd ts_shard trainshard)
if(TARGET ts_worker_main)
  list(APPEND ts_install_programs ts_worker_main)
endif()
# A libtorch outside the system's library folders (TS_TORCH_DIR, a CUDA runtime) stays found
# from the installed binaries; Debian's libraries need no run path and get none.
set_target_properties(${ts_install_programs} PROPERTIES INSTALL_RPATH_USE_LINK_PATH TRUE)
install(TARGETS ${ts_install_programs} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        COMPONENT runtime)
if(TARGET ts_sentencepiece_shim)
  install(TARGETS ts_sentencepiece_shim LIBRARY DESTINATION ${CMAKE_INSTALL_BINDIR}
          COMPONENT runtime)
endif()

# The units name /usr/local/bin and /usr/local/share/doc/trainshard; the installed copies name
# the folders this install uses (evaluated when installing, so `--prefix` counts).
function(ts_install_prefix_path out relative)
  if(IS_ABSOLUTE "${relative}")
    set(${out} "${relative}" PARENT_SCOPE)
  else()
    set(${out} "\${CMAKE_INSTALL_PREFIX}/${relative}" PARENT_SCOPE)
  endif()
endfunction()
ts_install_prefix_path(ts_unit_bindir "${CMAKE_INSTALL_BINDIR}")
ts_install_prefix_path(ts_unit_docdir "${CMAKE_INSTALL_DOCDIR}")
ts_install_prefix_path(ts_unit_dir "${TS_INSTALL_SYSTEMD_UNIT_DIR}")
foreach(unit trainshardd.service trainshard-devnet.service)
  set(staged "${PROJECT_BINARY_DIR}/deploy-units/${unit}")
  install(CODE "
    file(READ \"${PROJECT_SOURCE_DIR}/deploy/${unit}\" ts_unit_text)
    string(REPLACE \"/usr/local/share/doc/trainshard/\" \"${ts_unit_docdir}/\"
           ts_unit_text \"\${ts_unit_text}\")
    string(REPLACE \"/usr/local/bin/\" \"${ts_unit_bindir}/\" ts_unit_text \"\${ts_unit_text}\")
    file(WRITE \"${staged}\" \"\${ts_unit_text}\")
    file(INSTALL DESTINATION \"${ts_unit_dir}\" TYPE FILE FILES \"${staged}\")
  " COMPONENT systemd)
endforeach()
install(FILES deploy/trainshard.sysusers.conf DESTINATION ${TS_INSTALL_SYSUSERS_DIR}
        RENAME trainshard.conf COMPONENT systemd)

install(FILES deploy/trainshardd.example.toml deploy/devnet-genesis.example.json
              deploy/trainshardd-cuda.conf
        DESTINATION ${CMAKE_INSTALL_DATADIR}/trainshard COMPONENT examples)

file(GLOB ts_install_docs CONFIGURE_DEPENDS "${PROJECT_SOURCE_DIR}/docs/*.md")
install(FILES README.md ${ts_install_docs} DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT doc)
