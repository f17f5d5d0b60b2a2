"""Natural keys: every spelling of one CPF, CNPJ or code is one key, and a
value that cannot be one is refused with a reason a person understands."""

from __future__ import annotations

import pytest

from onceonly.importer import (
    InvalidValue,
    KeyType,
    normalize_cnpj,
    normalize_code,
    normalize_cpf,
    normalize_key,
)


@pytest.mark.parametrize(
    "spelling",
    [
        "123.456.789-09",
        "12345678909",
        " 123.456.789-09 ",
        "123 456 789 09",
        "123456789-09",
        "123.456.789/09",
        12345678909,  # a number cell
        12345678909.0,  # a number cell read as float
    ],
)
def test_every_spelling_of_a_cpf_is_one_key(spelling: object) -> None:
    assert normalize_cpf(spelling) == "12345678909"


def test_a_cpf_that_lost_its_leading_zero_in_a_spreadsheet_gets_it_back() -> None:
    assert normalize_cpf(1234567890) == "01234567890"
    assert normalize_cpf("1234567890") == "01234567890"
    assert normalize_cpf("012.345.678-90") == "01234567890"


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("123.456.789-00", "check digits do not match"),
        ("529.982.247-52", "check digits do not match"),
        ("111.111.111-11", "repeated digits"),
        ("000.000.000-00", "repeated digits"),
        ("123.456.789", "11 digits"),  # punctuation says it is not a lost zero
        ("123.456.789-091", "11 digits"),
        ("1234567890a", "11 digits"),
        ("CPF 12345678909", "11 digits"),
        ("", "empty"),
        (1234.5, "not a document number"),
        (True, "not a document number"),
    ],
)
def test_an_invalid_cpf_is_refused_with_the_reason(value: object, reason: str) -> None:
    with pytest.raises(InvalidValue, match=reason):
        normalize_cpf(value)


def test_the_refusal_quotes_the_value_as_written() -> None:
    with pytest.raises(InvalidValue) as refused:
        normalize_cpf("123.456.789-00")
    assert "'123.456.789-00'" in str(refused.value)


@pytest.mark.parametrize(
    "spelling", ["11.222.333/0001-81", "11222333000181", "11.222.333/000181", 11222333000181]
)
def test_every_spelling_of_a_cnpj_is_one_key(spelling: object) -> None:
    assert normalize_cnpj(spelling) == "11222333000181"


def test_a_cnpj_that_lost_its_leading_zero_gets_it_back() -> None:
    assert normalize_cnpj(4252011000110) == "04252011000110"


def test_alphanumeric_cnpjs_from_2026_are_validated_and_upper_cased() -> None:
    assert normalize_cnpj("12.ABC.345/01DE-35") == "12ABC34501DE35"
    assert normalize_cnpj("12.abc.345/01de-35") == "12ABC34501DE35"
    with pytest.raises(InvalidValue, match="check digits"):
        normalize_cnpj("12.ABC.345/01DE-36")


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("11.222.333/0001-82", "check digits do not match"),
        ("00.000.000/0000-00", "repeated digits"),
        ("11.222.333/0001", "14 characters"),
        ("12.ABC.345/01DE-3X", "the last two digits"),
        ("", "empty"),
    ],
)
def test_an_invalid_cnpj_is_refused_with_the_reason(value: object, reason: str) -> None:
    with pytest.raises(InvalidValue, match=reason):
        normalize_cnpj(value)


@pytest.mark.parametrize(
    ("value", "key"),
    [
        (" ABC-01 ", "abc-01"),
        ("abc-01", "abc-01"),
        ("Straße", "strasse"),
        ("STRASSE", "strasse"),
        ("Cafe\u0301", "café"),  # e + combining accent, as some systems write it
        ("Café", "café"),
        (123, "123"),
        (123.0, "123"),  # a number cell, not "123.0"
    ],
)
def test_codes_are_trimmed_and_case_folded(value: object, key: str) -> None:
    assert normalize_code(value) == key


def test_an_empty_code_is_refused() -> None:
    with pytest.raises(InvalidValue, match="empty code"):
        normalize_code("   ")


def test_key_types_by_name() -> None:
    assert normalize_key("cpf", "123.456.789-09") == "12345678909"
    assert normalize_key(KeyType.CNPJ, "11.222.333/0001-81") == "11222333000181"
    assert normalize_key("code", " X ") == "x"
    assert normalize_key("raw", " X ") == " X "
    assert {k.value for k in KeyType} == {"cpf", "cnpj", "code", "raw"}
    with pytest.raises(ValueError, match="'rg'"):
        normalize_key("rg", "1")


def test_key_types_on_the_command_line_follow_the_key_or_name_the_column() -> None:
    import click

    from onceonly.importer.command import _key_types

    assert _key_types(["cnpj", "sku"], ("cnpj,code",)) == {"cnpj": "cnpj", "sku": "code"}
    assert _key_types(["cnpj", "sku"], ("sku=code", "cnpj")) == {"cnpj": "cnpj", "sku": "code"}
    with pytest.raises(click.BadParameter, match="2 key types for 1 key column"):
        _key_types(["cpf"], ("cpf,code",))
