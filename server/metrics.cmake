# pagoda_metrics: every Prometheus metric family of the server, the typed calls that
# record into them, and the /metrics exposition (prometheus-cpp's Exposer).
# Included from server/CMakeLists.txt; needs only the kernels' public headers.

find_package(prometheus-cpp CONFIG REQUIRED)

add_library(pagoda_metrics
  ${CMAKE_CURRENT_LIST_DIR}/metrics.cc
  ${CMAKE_CURRENT_LIST_DIR}/metrics_labels.cc
  ${CMAKE_CURRENT_LIST_DIR}/metrics_summary.cc
  ${CMAKE_CURRENT_LIST_DIR}/metrics_window.cc
)
target_include_directories(pagoda_metrics PUBLIC
  ${CMAKE_CURRENT_LIST_DIR}
  ${PROJECT_SOURCE_DIR}/kernels/include)
target_link_libraries(pagoda_metrics
  PUBLIC pagoda_options fmt::fmt
  PRIVATE prometheus-cpp::core prometheus-cpp::pull)
