# dsactor_layer(<target> SOURCES ... DEPS ... INCLUDES ...): one static library per folder of
# DESIGN.md. A folder with no .cpp yet becomes an interface library so the layering holds
# from the first commit on.
function(dsactor_layer target)
  cmake_parse_arguments(L "" "" "SOURCES;DEPS;INCLUDES" ${ARGN})
  if(L_SOURCES)
    add_library(${target} STATIC ${L_SOURCES})
    target_link_libraries(${target} PUBLIC ${L_DEPS})
    if(L_INCLUDES)
      target_include_directories(${target} PUBLIC ${L_INCLUDES})
    endif()
  else()
    add_library(${target} INTERFACE)
    target_link_libraries(${target} INTERFACE ${L_DEPS})
    if(L_INCLUDES)
      target_include_directories(${target} INTERFACE ${L_INCLUDES})
    endif()
  endif()
endfunction()
