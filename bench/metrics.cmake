# bench/metrics.cmake: the scrape cost of the Prometheus endpoint (src/metrics).
#   build/bench/metrics_scrape [--vcpus 64] [--registers 20] [--exits 50] [--repeat 20]
add_executable(metrics_scrape ${CMAKE_CURRENT_LIST_DIR}/metrics_scrape.cc)
target_link_libraries(metrics_scrape PRIVATE exitscope_metrics)
target_include_directories(metrics_scrape PRIVATE ${CMAKE_SOURCE_DIR}/tests/metrics)
