# Writes a binary file into a C++ header as a byte array, so a library carries it (the XDP program's object: the
# daemons need no file beside them). cmake -DIN=file.o -DOUT=header.h -DNAME=kSymbol -P embed.cmake
foreach(var IN ITEMS IN OUT NAME)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "embed.cmake: -D${var}=... is missing")
  endif()
endforeach()
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" digits)
if(digits EQUAL 0)
  message(FATAL_ERROR "embed.cmake: ${IN} is empty")
endif()
math(EXPR bytes "${digits} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
# 16 bytes a line (CMake's regular expressions have no {n}).
string(REPEAT "0x[0-9a-f][0-9a-f]," 16 line)
string(REGEX REPLACE "(${line})" "\\1\n" body "${body}")
get_filename_component(from "${IN}" NAME)
file(WRITE "${OUT}.tmp"
  "// Generated from ${from} by embed.cmake: do not edit.\n#pragma once\n\n#include <cstddef>\n\n"
  "alignas(8) inline constexpr unsigned char ${NAME}[] = {\n${body}\n};\n"
  "inline constexpr std::size_t ${NAME}Size = ${bytes};\n")
file(RENAME "${OUT}.tmp" "${OUT}")
