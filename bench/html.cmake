# The HTML report of a synthetic 1 M-exit dump -> build/bench/html_report_scale (docs/html-report.md).
add_executable(html_report_scale ${CMAKE_CURRENT_LIST_DIR}/html_report_scale.cc)
target_link_libraries(html_report_scale PRIVATE exitscope_report exitscope_analysis exitscope_sources exitscope_recorder)
